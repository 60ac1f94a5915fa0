"""Property test: numbers in history tool-call arguments keep their exact value in the prompt.

The official renderer parses the arguments and spells each number from the parsed double with the
shortest digits that round-trip: V4.1 exactly as Python's `repr(float)`, V4 in serde's layout with an
explicit `+` on positive exponents (`1e+16`, `1e-7`, `0.00001`). Integers that fit 64 bits stay as
written; larger ones become doubles. The recorded `divergences/*` cases pin the same behaviour against
the official wheel; this test covers random doubles.
"""

import decimal
import json
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

import deepseek_recipe as dr

MARK = 'name="x" string="false">'


def serde_spelling(value: float) -> str:
    """The V4 layout: shortest round-trip digits, plain between 1e-5 and 1e16, else `d.ddde±x`."""
    if value == 0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    sign, digits, exponent = decimal.Decimal(repr(value)).normalize().as_tuple()
    text = "".join(map(str, digits))
    length = len(text)
    kk = length + exponent
    prefix = "-" if sign else ""
    if exponent >= 0 and kk <= 16:
        return f"{prefix}{text}{'0' * exponent}.0"
    if 0 < kk <= 16:
        return f"{prefix}{text[:kk]}.{text[kk:]}"
    if -5 < kk <= 0:
        return f"{prefix}0.{'0' * -kk}{text}"
    mantissa = text if length == 1 else f"{text[0]}.{text[1:]}"
    return f"{prefix}{mantissa}e{'+' if kk > 0 else '-'}{abs(kk - 1)}"


def expected(number_text: str, v41: bool) -> str:
    value = json.loads(number_text)
    if number_text == "-0":
        value = -0.0  # serde_json reads a negative zero integer as the double -0.0
    if isinstance(value, int) and -(2**63) <= value < 2**64:
        return str(value)
    value = float(value)
    return repr(value) if v41 else serde_spelling(value)


def rendered(number_text: str, model: str) -> str:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": f'{{"x": {number_text}}}'}}
    body = {
        "model": model,
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": "r"},
        ],
    }
    conversation = dr.ChatCompletionRequest(body).convert(dr.ConversionOptions()).conversation
    encoding = dr.DeepseekV41Encoding() if model.endswith("Flash") else dr.DeepseekV4Encoding()
    prompt = encoding.render_conversation(conversation).prompt
    start = prompt.index(MARK) + len(MARK)
    return prompt[start : prompt.index("</", start)]


def check(number_text: str) -> None:
    assert rendered(number_text, "DeepSeek-V4.1-Flash") == expected(number_text, v41=True), number_text
    assert rendered(number_text, "DeepSeek-V4-Pro") == expected(number_text, v41=False), number_text


finite_doubles = st.integers(0, 2**64 - 1).map(lambda bits: struct.unpack("<d", struct.pack("<Q", bits))[0])


@settings(max_examples=300, deadline=None)
@given(finite_doubles.filter(lambda x: x == x and abs(x) != float("inf")))
def test_random_doubles_round_trip(value):
    check(repr(value))


@settings(max_examples=150, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_hypothesis_floats_round_trip(value):
    check(repr(value))


@settings(max_examples=150, deadline=None)
@given(st.integers(-(2**70), 2**70))
def test_integers_beyond_2_53(value):
    check(str(value))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9), st.integers(0, 10**17), st.integers(-320, 305), st.sampled_from(["e", "E", "e+"]))
def test_exponent_spellings(lead, fraction, exponent, marker):
    text = (
        f"{lead}.{fraction}{marker}{exponent}"
        if exponent >= 0 or marker != "e+"
        else f"{lead}.{fraction}e{exponent}"
    )
    check(text)


def test_corners():
    for text in (
        "0.9305948696218223",
        "-0.0",
        "-0",
        "0",
        "5e-324",
        "1.7976931348623157e308",
        "1e16",
        "1e-5",
        "1e-4",
        "562949953421312.25",  # halfway between ...312.2 and ...312.3: Python prints the even one
        "-1006941805277235.25",
    ):
        check(text)

"""Speculative decoding for deepinfer (DSpark drafting, confidence-scheduled verification, MTP).

Speculators register through the `deepinfer.speculators` entry-point group; none ships yet.
"""

"""`deepinfer serve`: an OpenAI- and Anthropic-compatible HTTP server over the engine.

Layout: `async_engine` (the engine loop in its own thread), `pipeline` (the one output pipeline through
deepseek_recipe), `protocols` (chat / messages / responses framing), `routes_*` (one module per route
family), `metrics`, `errors`, `http` (bodies, disconnects, SSE), `store` (Responses store), `state`,
`app` (middleware and error handlers).
"""

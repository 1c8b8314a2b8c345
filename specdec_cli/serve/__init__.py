"""``specdec serve``: an OpenAI-compatible HTTP server over the engine's continuous batching.

- ``app``: the FastAPI routes (``create_app``);
- ``loop``: the engine thread (``EngineLoop``) that batches every HTTP request's engine requests;
- ``protocol``: request bodies and response JSON;
- ``metrics``: the Prometheus exposition of /metrics;
- ``server``: ``check_server`` and ``Server`` (uvicorn on ``server.host`` / ``server.port``).
"""

"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) in front of AsyncLLM."""

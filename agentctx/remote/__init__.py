"""OpenAI-compatible servers as the app's backend (`agentctx ask|tui --backend URL`): vLLM,
SGLang, llama.cpp's llama-server or `agentctx serve`. The client speaks HTTP through httpx
(client.py), streams chat completions with tools (chat_stream.py), counts tokens with the
server's /tokenize or an estimate (tokens.py), routes each session to one replica
(routing.py) and runs the turn's tool loop over the API (turn.py) behind the app's Backend
interface (backend.py); named backends come from config.json (backend_config.py)."""

"""OpenAI's protocol as typed models: the requests this server accepts and the responses it
sends (`requests`, `chat_messages`, `responses`, `chunks`, `logprobs`, `models`, `errors`), their
shared field types (`fields`) and the JSON schema generated from them (`schema`).

The models check the protocol's shape and types only; what a value means to the engine
(a γ that is allowed, a proposer that exists, a temperature >= 0) is checked once, by the
core (`specdec.serving.text_request`, `specdec.sampling.sampling_params`). `specdec_http.openai_api` is the one
place that maps a request model to the core's `TextRequest`.
"""

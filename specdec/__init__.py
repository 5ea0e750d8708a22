"""specdec: lossless speculative decoding.

This package is the *pure core*: plain Python and torch, no ray, grpc or redis. The
distributed shells (Ray actors, gRPC services, the Redis load store) live outside it and
only wire and translate.

Terms, defined once and used everywhere (code, protos, metrics, configs):

* **round** - one propose -> verify -> accept -> roll back cycle for a sequence.
* **gamma (γ)** - the number of tokens the proposer guesses in a round (0 = plain decoding).
* **drafted tokens** - the proposals offered for verification in a round (≤ γ).
* **accepted token** - a drafted token the target keeps (greedy: it equals the target's
  argmax; sampled: it passed the min(1, p/q) test).
* **recovered token** - the token the target samples at the first rejection, from
  norm(max(0, p - q)) (greedy: the target's argmax).
* **bonus token** - the token the target samples after all drafted tokens were accepted.
  Every round emits exactly one recovered-or-bonus token after its accepted tokens.
* **acceptance rate (α)** - accepted tokens / drafted tokens.
* **mean accepted length** - tokens emitted per round = (accepted + rounds) / rounds, i.e.
  it includes the recovered/bonus token, so plain decoding has 1.0.
"""

__version__ = "0.1.0"

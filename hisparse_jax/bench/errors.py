"""The one error type of `hisparse-bench`: a refusal the command prints as one line."""

from __future__ import annotations


class BenchError(Exception):
    """A refusal: printed as one line `hisparse-bench: error: ...`, exit status `status`
    (2: a bad argument; 1: the arguments are valid but nothing can be measured)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(" ".join(message.split()))  # one line, whatever the source wrote
        self.status = status

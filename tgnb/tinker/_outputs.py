"""``loss_fn_outputs`` as Tinker's: the model's logprobs at every position.

Tinker returns the per-token logprobs of every target, the zero-weight ones included (the
cookbook reads them there: prompt tokens, masked turns). The Post-Training API returns zeros where
the loss excludes a position (``weights`` or ``mask`` 0: the SDK's ``LossFnOutput``). So when a
datum has such positions and the outputs are wanted, this layer also submits a scoring pass
(``forward``: cross-entropy, every position weighted, no gradient) just before the operation,
on the same weights, and fills the excluded positions from it; the counted positions keep the
operation's own values. That pass costs one forward (no backward) on the service; pass
``return_loss_fn_outputs=False`` to skip it when the outputs are not read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from together.post_training.tinker import types


def excluded(data: Sequence[types.Datum]) -> list[list[int]] | None:
    """Per datum, the positions its loss excludes (``weights``, else ``mask``, is 0); ``None``
    when no datum has any (then the API's outputs are complete)."""
    holes = []
    for datum in data:
        inputs = datum.loss_fn_inputs
        sel = inputs.get("weights", inputs.get("mask"))
        values = [] if sel is None else sel.tolist()
        holes.append([i for i, v in enumerate(values) if v == 0])
    return holes if any(holes) else None


def scoring_data(data: Sequence[types.Datum]) -> list[types.Datum]:
    """`data` for a cross-entropy pass that counts every position (its logprobs all real)."""
    out = []
    for datum in data:
        targets = datum.loss_fn_inputs["target_tokens"]
        ones = types.TensorData(data=[1.0] * len(targets.tolist()), dtype="float32")
        out.append(
            types.Datum(
                model_input=datum.model_input,
                loss_fn_inputs={"target_tokens": targets, "weights": ones},
            )
        )
    return out


def filled(
    holes: list[list[int]],
    output: types.ForwardBackwardOutput,
    scored: types.ForwardBackwardOutput,
) -> types.ForwardBackwardOutput:
    """`output` with each datum's excluded positions' logprobs taken from `scored`."""
    outputs = []
    for where, own, full in zip(holes, output.loss_fn_outputs, scored.loss_fn_outputs, strict=True):
        values = own["logprobs"].tolist()
        complete = full["logprobs"].tolist()
        for i in where:
            values[i] = complete[i]
        outputs.append({**own, "logprobs": types.TensorData(data=values, dtype="float32")})
    return dataclasses.replace(output, loss_fn_outputs=outputs)

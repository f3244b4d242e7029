"""The plain calls awaited, and the ``_async`` twins warning as the installed tinker warns them.

Tinker 0.38 marks its ``_async`` twins (and a few plain calls) ``@deprecated`` (``FutureWarning``,
its own message), the plain calls answering futures that can be awaited; tinker 0.23.1 marks none.
The layer warns exactly where the installed tinker would (`tgnb.tinker._deprecated`): these tests
run with either (the CI's main environment has the newest tinker, its venv 0.23.1) and check the
branch that the installed one takes, against the genuine package's own marks.
"""

from __future__ import annotations

import asyncio
import re
import warnings
from typing import Any

import pytest

from tgnb.emulator.testing import EmulatorHandle

genuine = pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
import tgnb.tinker as tinker  # noqa: E402
from tgnb.tinker._compat import TINKER_VERSION  # noqa: E402
from tgnb.tinker._deprecated import deprecation_of  # noqa: E402
from tgnb.tinker._rest import genuine_rest_client  # noqa: E402

from .test_tinker_layer import EXAMPLES  # noqa: E402
from .test_tinker_layer import process_example as datum  # noqa: E402

types = tinker.types
MODEL = "tgnb/tiny-llama"
PAIRS = [
    (tinker.ServiceClient, genuine.ServiceClient),
    (tinker.TrainingClient, genuine.TrainingClient),
    (tinker.SamplingClient, genuine.SamplingClient),
    (tinker.RestClient, genuine_rest_client()),
]
NEWER = TINKER_VERSION >= (0, 38)


def _marked(theirs: type) -> dict[str, tuple[str, type[Warning]]]:
    return {n: m for n, f in vars(theirs).items() if (m := deprecation_of(f)) is not None}


def _call(client: Any, name: str) -> None:
    """Call `name` with no arguments on a client that was never opened: the warning (if any)
    comes first; what the call then does (a coroutine, closed unawaited; an error for the
    missing arguments or connection) is not what is checked here."""
    try:
        out = getattr(client, name)()
    except (TypeError, AttributeError, NotImplementedError):
        return
    if asyncio.iscoroutine(out):
        out.close()


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=lambda c: c.__name__)
def test_the_deprecated_calls_warn_as_the_installed_tinker_does(ours: type, theirs: type) -> None:
    marked = _marked(theirs)
    if not NEWER:  # tinker 0.23.1 deprecates nothing, and neither does the layer
        assert marked == {} and tinker.DEPRECATED[ours.__name__] == []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for name in dir(ours):
                if name.endswith("_async") and hasattr(theirs, name):
                    _call(object.__new__(ours), name)
        return
    assert "create_lora_training_client_async" in _marked(genuine.ServiceClient)
    assert "forward_backward_async" in _marked(genuine.TrainingClient)
    assert "sample_async" in _marked(genuine.SamplingClient)
    served = [n for n in marked if hasattr(ours, n)]
    assert tinker.DEPRECATED[ours.__name__] == sorted(served)
    for name in served:
        message, category = marked[name]
        with pytest.warns(category, match=re.escape(message)) as caught:
            _call(object.__new__(ours), name)
        assert [w.filename for w in caught] == [__file__], name  # at the caller's line


def test_a_deprecated_call_the_layer_makes_itself_does_not_warn() -> None:
    """``load_state_async`` runs the (also deprecated) ``load_state`` on a thread: one warning,
    the user's call's."""
    client = object.__new__(tinker.TrainingClient)
    if not NEWER:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(AttributeError):
                asyncio.run(client.load_state_async("tinker://run/weights/c"))
        return
    # it reaches the body, and fails there: the client was never opened
    with pytest.warns(FutureWarning) as caught, pytest.raises(AttributeError):
        asyncio.run(client.load_state_async("tinker://run/weights/c"))
    assert [str(w.message) for w in caught] == [
        deprecation_of(genuine.TrainingClient.load_state_async)[0]  # type: ignore[index]
    ]


def test_plain_calls_awaited_and_the_twins_as_before(rl_emulator: EmulatorHandle) -> None:
    """``await`` on each plain call a Tinker 0.38 script awaits, in a running loop, with no
    deprecation warning; the ``_async`` twins still answer the same, with the installed tinker's
    warning (none with 0.23.1)."""

    async def main() -> dict[str, Any]:
        service = tinker.ServiceClient()
        try:
            training = await service.create_lora_training_client(base_model=MODEL, rank=4, seed=0)
            tokenizer = await asyncio.to_thread(training.get_tokenizer)
            data = [datum(p, c, tokenizer) for p, c in EXAMPLES]
            fwd = training.forward_backward(data, "cross_entropy")
            opt = training.optim_step(types.AdamParams(learning_rate=3e-3))
            first, _ = await fwd, await opt
            state = await training.save_state("s")
            weights = await training.save_weights_for_sampler("w")
            run = (await asyncio.to_thread(training.get_info)).model_id
            listed = await tinker.RestClient().list_checkpoints(run)
            sampler = await training.save_weights_and_get_sampling_client()
            prompt = types.ModelInput.from_ints(tokenizer.encode(EXAMPLES[0][0]))
            params = types.SamplingParams(max_tokens=3, temperature=0.0)
            sampled = await sampler.sample(prompt, 1, params)
            logprobs = await sampler.compute_logprobs(prompt)
            # the deprecated twins, last: the same answers
            again = await (await training.forward_backward_async(data, "cross_entropy"))
            sampled_again = await sampler.sample_async(prompt, 1, params)
            return {
                "first": first,
                "paths": (state.path, weights.path),
                "sampled": (sampled, sampled_again),
                "logprobs": logprobs,
                "listed": {c.tinker_path for c in listed.checkpoints},
                "again": again,
            }
        finally:
            await service.close()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = asyncio.run(main())
    assert out["first"].metrics["loss:sum"] > 0 and out["again"].metrics["loss:sum"] > 0
    state_path, weights_path = out["paths"]
    assert state_path.startswith("tinker://") and "/sampler_weights/" in weights_path
    assert {state_path, weights_path} <= out["listed"]
    for response in out["sampled"]:
        assert len(response.sequences[0].tokens) >= 1
    assert out["sampled"][0].sequences[0].tokens == out["sampled"][1].sequences[0].tokens
    assert out["logprobs"][0] is None and len(out["logprobs"]) > 1
    # what warned at this file's lines (the user's calls): the two twins only, as tinker warns
    here = [(str(w.message), w.category) for w in caught if w.filename == __file__]
    expected = [
        deprecation_of(genuine.TrainingClient.forward_backward_async),
        deprecation_of(genuine.SamplingClient.sample_async),
    ]
    assert here == (expected if NEWER else [])


def test_a_sync_call_inside_a_loop_is_worded_as_the_installed_tinker_words_it() -> None:
    """Tinker 0.23.1 points at the ``_async`` twin; 0.38, whose twins are deprecated, says to
    await the future."""
    from tgnb.tinker._offloop import sync_from_async

    said = sync_from_async("TrainingClient.get_info")
    assert said.startswith("Synchronous method 'TrainingClient.get_info()' called from async")
    if NEWER:
        assert "await the future instead" in said and "get_info_async" not in said
    else:
        assert "Use 'TrainingClient.get_info_async()' instead" in said

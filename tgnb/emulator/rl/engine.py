"""The compute of one Model Resource: a base model loaded once, its sessions, their operations.

A LoRA resource wraps the base model in ONE peft model; every session adds two named adapters over
the same base weights: its trainer adapter (trained, with its own optimizer over that adapter's
parameters only) and its published adapter (what `sample` uses). `weights_sync` copies trainer ->
published and sets the policy version to the trainer's step, so `optim_step` never changes what
sampling sees until then. A full-weight resource holds one session: the loaded model is trained and
a second copy is published.

Every public call takes the resource's lock (one accelerator: computations serialise). CPU by
default, CUDA when available. Bodies are validated fully (`tgnb.emulator.rl.inputs`) before any
tensor changes. Adam defaults (tinker's): lr 1e-4, betas (0.9, 0.95), eps 1e-12, weight decay 0
(decoupled, AdamW); ``grad_clip_norm`` unset means 1.0, 0 means off. Sampler logprobs are the
model's own (temperature 1), so they match `forward`'s for the same weights.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tgnb.emulator.rl import inputs, losses
from tgnb.emulator.rl.catalog import SAMPLING_DEFAULTS, ModelSpec
from tgnb.emulator.rl.inputs import NonFiniteLoss, ResourceAtCapacity, RLInputError
from tgnb.emulator.rl.quiet import quiet_peft

if TYPE_CHECKING:
    import torch

__all__ = [
    "NonFiniteLoss",
    "RLInputError",
    "ResourceAtCapacity",
    "ResourceHost",
    "export_checkpoint",
]

MAX_LORA_SESSIONS = 5

#: Loading is not thread-safe: ``from_pretrained`` swaps process-wide state (``torch.nn.init``,
#: the meta-device init context) while it loads, so two resources loading at once leave each
#: other's parameters on the meta device ("Cannot copy out of meta tensor"), and transformers'
#: lazy first imports race too ("cannot import name 'AutoTokenizer'"). Loads take turns.
_LOAD_LOCK = threading.Lock()


def _load_model(path: str, dtype: Any) -> Any:
    with _LOAD_LOCK:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def _load_tokenizer(path: str) -> Any:
    with _LOAD_LOCK:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)


SYNC_TYPES = (
    "WEIGHT_SYNC_TYPE_SYNCHRONOUS",
    "WEIGHT_SYNC_TYPE_BACKGROUND_PUBLISH",
    "WEIGHT_SYNC_TYPE_PIPELINE",
)


@dataclass
class LoraSession:
    sid: str
    train: str  # trainer adapter name ("" on a full-weight resource)
    published: str
    lora: dict[str, Any] | None
    params: list[Any]  # the trainable parameters (trainer adapter, or the whole model)
    pairs: list[tuple[Any, Any]]  # (trainer, published) tensors weights_sync copies
    optimizer: Any = None
    step: int = 0
    version: int = 0


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class ResourceHost:
    """One Model Resource: the base weights loaded ONCE; each LoRA session a named peft adapter
    (plus its own published copy for sampling and its own Adam state); a full-weight resource holds
    one session. Thread-safe: one internal lock (one GPU: computations on a resource serialise)."""

    def __init__(self, spec: ModelSpec, *, lora_enabled: bool, device: str | None = None) -> None:
        import torch

        self.tokenizer = _load_tokenizer(spec.path)
        model: Any = _load_model(spec.path, torch.float32)
        self.spec = spec
        self.lora_enabled = lora_enabled
        self.device = device or default_device()
        self.lock = threading.RLock()
        model = model.to(self.device).eval()
        model.requires_grad_(False)
        self.base = model
        self.model: Any = model  # becomes the PeftModel once a LoRA session opens
        self.published_model: Any = None  # full weight: the published copy
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.sessions: dict[str, LoraSession] = {}
        self._cancelled: set[str] = set()  # stopped sessions: their running work ends early
        self._counter = 0
        self._active = ""  # the adapter computing now (PeftModel.active_adapter can be stale)
        self._trained_in_place = False
        # read before any adapter is injected (peft adds Linear layers of its own)
        head = model.get_output_embeddings()
        self._head = next(n for n, m in model.named_modules() if m is head).rsplit(".", 1)[-1]
        from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

        linears = {
            n.rsplit(".", 1)[-1]
            for n, m in model.named_modules()
            if isinstance(m, (torch.nn.Linear, Conv1D))
        }
        self._linears = sorted(linears - {self._head})

    # ---- sessions ------------------------------------------------------------------------------
    def cancel(self, sid: str) -> None:
        """The session was stopped: its running sample ends at the next token and nothing else
        runs for it (no lock: the running operation holds it)."""
        self._cancelled.add(sid)

    def session(self, sid: str) -> LoraSession:
        if sid in self._cancelled:
            raise inputs.OperationCancelled(f"training session {sid} was stopped")
        sess = self.sessions.get(sid)
        if sess is None:
            raise RLInputError("session_id", f"session {sid!r} is not open on this resource")
        return sess

    def lora_config(self, config: dict[str, Any] | None) -> dict[str, Any]:
        """`config` checked and completed with the defaults (rank 32, alpha 32, dropout 0,
        train_unembed true); RLInputError("lora_config.<key>", ...) when out of range."""
        return inputs.lora_config(config, self.spec.max_lora_rank)

    def _target_modules(self, train_unembed: bool) -> list[str]:
        """Every linear layer of the base (by its last name), the unembedding when asked."""
        targets = self._linears + ([self._head] if train_unembed else [])
        if not targets:
            raise RLInputError(
                "lora_config.train_unembed", "this model has no other linear layer to adapt"
            )
        return targets

    def open_session(self, sid: str, lora_config: dict[str, Any] | None) -> None:
        """Open `sid`: a trainer + published adapter pair (LoRA) or the full-weight pair."""
        with self.lock:
            if sid in self.sessions:
                raise RLInputError("session_id", f"session {sid!r} is already open")
            if not self.lora_enabled:
                if lora_config:
                    raise RLInputError(
                        "lora_config", "this model resource is full-weight (lora_enabled false)"
                    )
                if self.sessions:
                    raise ResourceAtCapacity("a full-weight model resource holds one session")
                self.sessions[sid] = self._open_full(sid)
                return
            if len(self.sessions) >= MAX_LORA_SESSIONS:
                raise ResourceAtCapacity(
                    f"a LoRA model resource holds {MAX_LORA_SESSIONS} sessions"
                )
            cfg = self.lora_config(lora_config)
            self.sessions[sid] = self._open_lora(sid, cfg)

    def _open_full(self, sid: str) -> LoraSession:
        import copy

        if self._trained_in_place:  # a previous full-weight session trained the loaded weights
            fresh = _load_model(self.spec.path, self.base.dtype)
            self.base.load_state_dict(fresh.state_dict())
        self._trained_in_place = True
        self.published_model = copy.deepcopy(self.base).eval()
        self.published_model.requires_grad_(False)
        self.base.requires_grad_(True)
        params = [p for p in self.base.parameters()]
        pairs = list(
            zip(
                self.base.state_dict().values(),
                self.published_model.state_dict().values(),
                strict=True,
            )
        )
        return LoraSession(sid, "", "", None, params, pairs)

    def _open_lora(self, sid: str, cfg: dict[str, Any]) -> LoraSession:
        import torch
        from peft import LoraConfig, get_peft_model

        self._counter += 1
        train, pub = f"s{self._counter}", f"s{self._counter}_pub"
        peft_cfg = LoraConfig(
            r=cfg["rank"],
            lora_alpha=cfg["alpha"],
            lora_dropout=cfg["dropout"],
            target_modules=self._target_modules(cfg["train_unembed"]),
        )
        seed = cfg["seed"] if cfg["seed"] is not None else secrets.randbits(31)
        with torch.random.fork_rng(devices=[]), quiet_peft():
            torch.manual_seed(seed)
            if self.model is self.base:
                self.model = get_peft_model(self.base, peft_cfg, adapter_name=train)
            else:
                self.model.add_adapter(train, peft_cfg)
            self.model.add_adapter(pub, peft_cfg)
        self.model.to(self.device)
        self._active = ""  # force the next _activate to set the adapter explicitly
        tag_t, tag_p = f".{train}.", f".{pub}."
        named = dict(self.model.named_parameters())
        params, pairs = [], []
        for name, p in named.items():
            if tag_t in name:
                params.append(p)
                pairs.append((p, named[name.replace(tag_t, tag_p)]))
        with torch.no_grad():
            for t, q in pairs:
                q.copy_(t)
                q.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        return LoraSession(sid, train, pub, cfg, params, pairs)

    def close_session(self, sid: str) -> None:
        """Drop the session's adapters (or the full-weight copy) and optimizer."""
        with self.lock:
            self._cancelled.discard(sid)
            sess = self.session(sid)
            del self.sessions[sid]
            if sess.train:
                with quiet_peft():
                    self.model.delete_adapter(sess.train)
                    self.model.delete_adapter(sess.published)
                self._active = ""
            else:
                self.published_model = None
                self.base.requires_grad_(False)
                self.base.zero_grad(set_to_none=True)

    def _activate(self, sess: LoraSession, *, publish: bool) -> Any:
        """The module computing for `sess`: its trainer (or published) weights, active."""
        if not sess.train:
            return self.published_model if publish else self.base
        name = sess.published if publish else sess.train
        if self._active != name:
            # PeftModel's own set_adapter: it also sets `PeftModel.active_adapter`, which peft's
            # forward reads (the tuner's alone left it naming a deleted adapter once the last
            # session closed: KeyError 's1_pub' on every operation of the next session)
            self.model.set_adapter(name, inference_mode=publish)
            self._active = name
        if not publish:  # peft freezes adapters it is not activating (add_adapter too)
            for p in sess.params:
                p.requires_grad_(True)
        return self.model

    # ---- forward / backward --------------------------------------------------------------------
    def _logprobs(self, model: Any, batch: inputs.Batch) -> torch.Tensor:
        """`[B, T]` log-probabilities of target_tokens: one padded forward for the whole batch."""
        import torch
        import torch.nn.functional as F

        n, width = batch.valid.shape
        ids = torch.full((n, width), self._pad_id(), dtype=torch.long)
        for i, toks in enumerate(batch.tokens):
            ids[i, : len(toks)] = torch.tensor(toks)
        valid = batch.valid.to(self.device)
        logits = model(input_ids=ids.to(self.device), attention_mask=valid.long()).logits.float()
        targets = batch.inputs["target_tokens"].to(self.device)
        flat = F.cross_entropy(
            logits.reshape(n * width, -1), targets.reshape(-1), reduction="none"
        ).reshape(n, width)
        return -flat * valid

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))

    def forward_backward(self, sid: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{loss, samples, forward_only?, return_loss_fn_outputs?}`` -> the operation's output.
        Gradients accumulate into the session's trainable weights until `optim_step`."""
        import torch

        body = inputs.body_object(body)
        with self.lock:
            sess = self.session(sid)
            spec = losses.parse_loss(body.get("loss"))
            forward_only = inputs.flag(body, "forward_only")
            want_outputs = inputs.flag(body, "return_loss_fn_outputs")
            batch = self._batch(body.get("samples"), spec.required, spec.optional)
            model = self._activate(sess, publish=False)
            dev = {k: v.to(self.device) for k, v in batch.inputs.items()}
            valid = batch.valid.to(self.device)
            if forward_only:
                with torch.no_grad():
                    logp = self._logprobs(model.eval(), batch)
                    loss, metrics, counted = losses.compute(spec, logp, dev, valid)
            else:
                logp = self._logprobs(model.train(), batch)
                loss, metrics, counted = losses.compute(spec, logp, dev, valid)
                if not bool(torch.isfinite(loss)):
                    raise NonFiniteLoss(
                        f"the {spec.type} loss is {float(loss.detach())}; no gradient applied"
                    )
                try:
                    losses.accumulate(sess.params, loss)
                finally:
                    model.eval()
            if not bool(torch.isfinite(loss)):
                raise NonFiniteLoss(f"the {spec.type} loss is {float(loss.detach())}")
            out: dict[str, Any] = {"loss": float(loss.detach()), "metrics": metrics}
            if want_outputs:
                out["loss_fn_outputs"] = inputs.logprob_outputs(
                    logp.detach() * counted, batch.lengths
                )
            return out

    def custom_forward_backward(self, sid: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{samples, gradients}``: backprop ``Σ g·logp`` with the client's dL/dlogp per token
        (not masked by weights: tinker sends zero weights here)."""
        import torch

        body = inputs.body_object(body)
        with self.lock:
            sess = self.session(sid)
            # the gradients define the loss: any other known input rides along unused
            others = frozenset(losses.INPUT_DTYPES) - {"target_tokens"}
            batch = self._batch(body.get("samples"), frozenset({"target_tokens"}), others)
            grads = inputs.gradients(body.get("gradients"), batch.lengths)
            g = torch.nn.utils.rnn.pad_sequence(grads, batch_first=True).to(self.device)
            model = self._activate(sess, publish=False)
            logp = self._logprobs(model.train(), batch)
            surrogate = (g.to(logp.dtype) * logp).sum()
            try:
                if not bool(torch.isfinite(surrogate)):
                    raise NonFiniteLoss(
                        "sum(gradients x logprobs) overflows float32; no gradient applied "
                        "(scale the gradients down)"
                    )
                losses.accumulate(sess.params, surrogate)
            finally:
                model.eval()
            return {}

    def _batch(
        self, samples: Any, required: frozenset[str], optional: frozenset[str]
    ) -> inputs.Batch:
        return inputs.batch(
            samples,
            required=required,
            optional=optional,
            dtypes=losses.INPUT_DTYPES,
            vocab_size=self.vocab_size,
            max_len=self.spec.context_length,
        )

    # ---- optimizer, publishing -----------------------------------------------------------------
    def optim_step(self, sid: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{adam_params?}`` (or ``{muon_params?}``): one step over the session's accumulated
        gradients, then zero them. -> ``{"step": "N"}`` (int64 as a string)."""
        from tgnb.emulator.rl import optim

        with self.lock:
            sess = self.session(sid)
            optim.step(sess, body)
            sess.step += 1
            return {"step": str(sess.step)}

    def weights_sync(self, sid: str, body: dict[str, Any]) -> dict[str, Any]:
        """Publish the trainer's weights for sampling; the policy version becomes the step."""
        import torch

        with self.lock:
            sess = self.session(sid)
            kind = (body or {}).get("weight_sync_type")
            if kind is not None and kind not in SYNC_TYPES:
                raise RLInputError("weight_sync_type", f"must be one of {', '.join(SYNC_TYPES)}")
            with torch.no_grad():
                for t, q in sess.pairs:
                    q.copy_(t)
            sess.version = sess.step
            return {"weights_version": sess.version}

    def policy_state(self, sid: str) -> dict[str, Any]:
        with self.lock:
            sess = self.session(sid)
            return {
                "applied_weights_version": sess.version,
                "target_weights_version": sess.step,
                "trainer_step": sess.step,
                "pending_publish": sess.version != sess.step,
            }

    def step(self, sid: str) -> int:
        with self.lock:
            return self.session(sid).step

    # ---- sampling ------------------------------------------------------------------------------
    def sample(self, sid: str, body: dict[str, Any]) -> dict[str, Any]:
        """``{model_inputs, num_samples?, sampling_params?, prompt_logprobs?, topk_prompt_logprobs?}``
        -> ``{"results": [SampleResult, ...]}`` from the session's published weights."""
        from tgnb.emulator.rl import sampling

        body = inputs.body_object(body)
        with self.lock:
            sess = self.session(sid)
            request = sampling.parse(
                body, self.vocab_size, self.spec.context_length, SAMPLING_DEFAULTS
            )
            model = self._activate(sess, publish=True).eval()
            return sampling.generate(
                model,
                self.tokenizer,
                request,
                sess.version,
                self.device,
                cancelled=lambda: sid in self._cancelled,
            )

    # ---- checkpoints ---------------------------------------------------------------------------
    def save_training_checkpoint(self, sid: str, directory: Path) -> None:
        """Trainer weights (adapter or full) + optimizer state + step/version: safetensors + JSON."""
        from tgnb.emulator.rl import checkpoints

        with self.lock:
            checkpoints.save(self, self.session(sid), Path(directory), training=True)

    def load_training_checkpoint(self, sid: str, directory: Path, *, load_optimizer: bool) -> None:
        """Load a training checkpoint into `sid` (its LoRA config is the checkpoint's)."""
        from tgnb.emulator.rl import checkpoints

        with self.lock:
            checkpoints.load(self, sid, Path(directory), load_optimizer=load_optimizer)

    def save_inference_checkpoint(self, sid: str, directory: Path) -> None:
        """The trainer's weights at its step (adapter or full weights) + JSON metadata."""
        from tgnb.emulator.rl import checkpoints

        with self.lock:
            checkpoints.save(self, self.session(sid), Path(directory), training=False)

    def memory_bytes(self) -> int:
        """Bytes held in tensors: every distinct parameter, buffer, gradient and optimizer state
        (the base weights count once however many adapters share them)."""
        import torch

        with self.lock:
            seen: dict[tuple[int, str], int] = {}

            def add(t: Any) -> None:
                if isinstance(t, torch.Tensor):
                    key = (t.untyped_storage().data_ptr(), str(t.device))
                    seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())

            modules = [self.model] + ([self.published_model] if self.published_model else [])
            for mod in modules:
                for p in mod.parameters():
                    add(p)
                    add(p.grad)
                for b in mod.buffers():
                    add(b)
            for sess in self.sessions.values():
                if sess.optimizer is not None:
                    for v in sess.optimizer.state_tensors():
                        add(v)
            return sum(seen.values())


def export_checkpoint(directory: Path, variant: str, out: Path) -> list[Path]:
    """Write `variant` (CHECKPOINT_VARIANT_ADAPTER | _MERGED) of the checkpoint in `directory`
    into `out`; the written files."""
    from tgnb.emulator.rl import checkpoints

    return checkpoints.export(Path(directory), variant, Path(out))

#!/usr/bin/env bash
# One short check (< 8 min) on a machine with one H200: tgnb's checkpoint path on the GPU.
#   bash bench/gpu_check.sh            (from the repository root, tgnb[train] installed)
# 1. bench/checkpoint.py on CUDA-sized states: (a) async stall / sync stall, (b) preempt / plain
#    write, (c) load / plain read, for 1B parameters (fp32 + AdamW: about 12 GB a save).
# 2. A real run: a ~1B-parameter Llama built from a config (no download), bf16, DPO through
#    `python -m tgnb.train`, periodic async saves every 5 steps, SIGTERM after 12 logged steps;
#    prints the CheckpointSaved events (stall_s of the periodic saves, duration_s of the signal's)
#    and the exit code (75 expected).
# 3. FSDP2 through the Trainer (trl.fsdp=true; accelerate ignores it on the CPU, so no CPU test has
#    it): the tiny model, DPO, 1 rank under tgnb.train.launch (one GPU: NCCL allows no two ranks on
#    it), SIGTERM after 4 steps (exit 75), resumed from the DCP state of the FSDP model, finished at
#    step 300 (exit 0); prints the RunResumed event and whether every step was logged once.
set -euo pipefail
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="${PYTHONPATH:-$PWD}"
OUT="${OUT:-$(mktemp -d)}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

echo "== 1. checkpoint ratios (1B parameters, 1 rank)"
timeout 300 python bench/checkpoint.py --params 1e9 --ranks 1 --repeats 1 --device cuda --dir "$OUT" | tail -2

echo "== 2. DPO, ~1B Llama from a config, bf16, async periodic saves, SIGTERM"
MODEL="$OUT/llama-1b"
python - "$MODEL" <<'PY'
import sys
from transformers import LlamaConfig, LlamaForCausalLM
from tgnb.train import assets
tok_dir = assets.tiny_path(0)  # the built-in character tokenizer
cfg = LlamaConfig(vocab_size=128, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                  num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=256)
model = LlamaForCausalLM(cfg)
print(f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters")
model.save_pretrained(sys.argv[1])
from transformers import AutoTokenizer
AutoTokenizer.from_pretrained(tok_dir).save_pretrained(sys.argv[1])
PY
RUN="$OUT/run"
python -m tgnb.train --run-dir "$RUN" --set algorithm=dpo --set "model=$MODEL" \
  --set max_steps=200 --set checkpoint.every_steps=5 --set checkpoint.watch_drain=false \
  --set trl.bf16=true --set trl.use_cpu=false --set trl.per_device_train_batch_size=4 \
  --set trl.learning_rate=1e-5 > "$OUT/run.log" 2>&1 &
PID=$!
until [ "$(grep -c '"kind": "metrics"' "$OUT/run.log" || true)" -ge 12 ]; do
  kill -0 $PID 2>/dev/null || { tail -30 "$OUT/run.log"; exit 1; }; sleep 2
done
kill -TERM $PID
set +e; wait $PID; CODE=$?; set -e
grep '"CheckpointSaved"' "$RUN/events.jsonl" | python -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)["data"]
    print(f"step {d[\"step\"]:4d} {d[\"trigger\"]:9s} stall {d[\"stall_s\"]:7.3f} s  "
          f"complete after {d[\"duration_s\"]:7.3f} s  {d[\"bytes\"] / 2**30:6.2f} GiB")'
echo "exit code $CODE (75 = preempted and checkpointed)"

echo "== 3. FSDP2 through the Trainer: tiny DPO, 1 rank, SIGTERM, resume"
RUN3="$OUT/fsdp"
FSDP=(python -m tgnb.train.launch --standalone --nproc_per_node=1 -m tgnb.train --run-dir "$RUN3"
  --set algorithm=dpo --set model=tiny --set max_steps=300 --set checkpoint.watch_drain=false
  --set trl.use_cpu=false --set trl.fsdp=true --set 'trl.fsdp_config={version: 2}')
"${FSDP[@]}" > "$OUT/fsdp-1.log" 2>&1 &
PID=$!
until [ "$(grep -c '"kind": "metrics"' "$OUT/fsdp-1.log" || true)" -ge 4 ]; do
  kill -0 $PID 2>/dev/null || { tail -30 "$OUT/fsdp-1.log"; exit 1; }; sleep 0.2
done
for child in $(pgrep -P $PID); do  # SIGTERM to the worker of rank 0, as Kubernetes would
  if tr '\0' '\n' < "/proc/$child/environ" | grep -qx RANK=0; then kill -TERM "$child"; fi
done
set +e; wait $PID; CODE1=$?; timeout 300 "${FSDP[@]}" > "$OUT/fsdp-2.log" 2>&1; CODE2=$?; set -e
echo "preempted: exit $CODE1 (75 expected); resumed: exit $CODE2 (0 expected)"
python - "$RUN3" <<'PY'
import json, sys
run = sys.argv[1]
events = [json.loads(line) for line in open(f"{run}/events.jsonl")]
print([e["data"] for e in events if e["reason"] == "RunResumed"])
steps = sorted(json.loads(line)["step"] for line in open(f"{run}/metrics.jsonl"))
print("every step logged once:", steps == list(range(1, 301)), len(steps), "rows")
PY

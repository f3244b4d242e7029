#!/usr/bin/env bash
# tgnb's checkpoint path on a machine with one H200: about 5 min, at most 8 (the limits below).
#   bash bench/gpu_check.sh 2>&1 | tee "$OUT/gpu_check.log"    (repository root; python3 on PATH)
# tgnb[train]'s dependencies must import; the H200 image of the device README has no trl, datasets,
# dill or multiprocess: carry their wheels (bench/gpu_wheels.sh fetches them and gives the call).
# 1. bench/checkpoint.py on CUDA-sized states: (a) async stall / sync stall, (b) preempt / plain
#    write, (c) load / plain read, for 500M parameters (fp32 + AdamW: about 6 GB a save).
# 2. A real run: a 0.8B-parameter Llama (10 GB a save) built from a config, bf16, DPO through
#    `python -m tgnb.train`, periodic async saves every 5 steps, SIGTERM after 12 logged steps;
#    prints the CheckpointSaved events (stall_s of the periodic saves, duration_s of the signal's)
#    and the exit code (75 expected).
# 3. FSDP2 through the Trainer (trl.fsdp=true, fsdp_config version 2: TrainingArguments turn them
#    into accelerate's FullyShardedDataParallelPlugin(fsdp_version=2); accelerate ignores
#    it on the CPU, so no CPU test has it): the tiny model, DPO, 1 rank under tgnb.train.launch (one
#    GPU: NCCL allows no two ranks on it), SIGTERM to rank 0 after 4 steps (exit 75), resumed from
#    the DCP state of the FSDP model, finished at step 300 (exit 0); prints the RunResumed event and
#    whether every step was logged once.
# A failed section says so and the next one runs; each part has a time limit (together 8 min 15 s).
#
# The knobs below default to the GPU run. The same script at tiny scale on a CPU (what
# tests/train/checkpoint/test_gpu_check.py runs; section 3 then runs DDP, not FSDP: it checks the shell
# logic and the resume only):
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_PARAMS=1e6 GPU_CHECK_SHAPE=64,128,2 GPU_CHECK_FSDP_STEPS=100 \
#     bash bench/gpu_check.sh
set -uo pipefail
DEVICE="${GPU_CHECK_DEVICE:-cuda}"          # cuda | cpu
PARAMS="${GPU_CHECK_PARAMS:-5e8}"           # section 1: parameters of the benched state
SHAPE="${GPU_CHECK_SHAPE:-2048,5632,16}"    # section 2: the Llama's hidden, intermediate size, layers
FSDP_STEPS="${GPU_CHECK_FSDP_STEPS:-300}"   # section 3: max_steps (SIGTERM after 4)
DIR="${GPU_CHECK_DIR:-$(mktemp -d)}"        # scratch (about 30 GB on the GPU): not $OUT, which is sent back
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
CPU=$([ "$DEVICE" = cpu ] && echo true || echo false)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python3 -c 'import sys, torch, transformers, accelerate, trl, datasets, pyarrow
print("python", sys.version.split()[0], *(f"{m.__name__} {m.__version__}" for m in (torch,
      transformers, accelerate, trl, datasets, pyarrow)))' || echo "a package is missing: bench/gpu_wheels.sh"

children() {  # the processes whose parent is $1, from /proc (pgrep may be missing on the GPU image)
  local d ppid
  for d in /proc/[0-9]*; do
    read -r _ _ _ ppid _ 2>/dev/null <"$d/stat" && [ "$ppid" = "$1" ] && echo "${d#/proc/}"
  done
  return 0
}
await() {  # await PID LOG N: until LOG holds N metrics rows; fails (LOG's tail shown) if PID ends first
  until [ "$(cat "$2" 2>/dev/null | grep -c '"kind": "metrics"')" -ge "$3" ]; do  # (LOG may not exist yet)
    kill -0 "$1" 2>/dev/null || { tail -30 "$2"; return 1; }
    sleep 0.2
  done
}

echo "== 1. checkpoint ratios ($PARAMS parameters, 1 rank, $DEVICE)"
timeout 150 python3 bench/checkpoint.py --params "$PARAMS" --ranks 1 --repeats 1 --device "$DEVICE" \
  --dir "$DIR" >"$DIR/bench.log" 2>&1
CODE=$?
if [ $CODE = 0 ]; then tail -2 "$DIR/bench.log"; else
  tail -30 "$DIR/bench.log"  # the whole traceback, not its last line
  echo "section 1 failed: exit $CODE (124: over its 150 s)"
fi

echo "== 2. [${SECONDS} s] DPO, Llama ($SHAPE) from a config, bf16, async periodic saves, SIGTERM"
MODEL="$DIR/llama"
timeout 60 python3 - "$MODEL" "$SHAPE" <<'PY'
import sys
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from tgnb.tasks import assets
hidden, intermediate, layers = (int(x) for x in sys.argv[2].split(","))
cfg = LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=intermediate,
                  num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16,
                  max_position_embeddings=256)
model = LlamaForCausalLM(cfg)
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
model.save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(assets.tiny_path(0)).save_pretrained(sys.argv[1])  # by characters
PY
RUN="$DIR/run"
timeout 150 python3 -m tgnb.train --run-dir "$RUN" --set algorithm=dpo --set "model=$MODEL" \
  --set max_steps=200 --set checkpoint.every_steps=5 --set checkpoint.watch_drain=false \
  --set trl.bf16=true --set trl.use_cpu=$CPU --set trl.per_device_train_batch_size=4 \
  --set trl.learning_rate=1e-5 >"$DIR/run.log" 2>&1 &
PID=$!  # timeout's; the run is its child
await $PID "$DIR/run.log" 12 && kill -TERM $(children $PID)
wait $PID
CODE=$?
python3 - "$RUN" <<'PY'
import sys
from tgnb.events import CHECKPOINT_SAVED, read_jsonl
for e in read_jsonl(f"{sys.argv[1]}/events.jsonl"):
    if e.reason == CHECKPOINT_SAVED:
        d = e.data
        print(f"step {d['step']:4d} {d['trigger']:9s} stall {d['stall_s']:7.3f} s  "
              f"complete after {d['duration_s']:7.3f} s  {d['bytes'] / 2**30:6.2f} GiB")
PY
echo "exit code $CODE (75 = preempted and checkpointed; 124: over its 150 s)"
rm -rf "$RUN/checkpoints"  # room for section 3

echo "== 3. [${SECONDS} s] FSDP2 through the Trainer: tiny DPO, 1 rank, SIGTERM, resume"
RUN3="$DIR/fsdp"
FSDP=(python3 -m tgnb.train.launch --standalone --nproc_per_node=1 -m tgnb.train --run-dir "$RUN3"
  --set algorithm=dpo --set model=tiny --set max_steps="$FSDP_STEPS" --set checkpoint.watch_drain=false
  --set trl.use_cpu=$CPU --set trl.fsdp=true --set 'trl.fsdp_config={version: 2}')
timeout 60 "${FSDP[@]}" >"$DIR/fsdp-1.log" 2>&1 &
PID=$!
if await $PID "$DIR/fsdp-1.log" 4; then
  for worker in $(children $(children $PID)); do  # timeout > launcher > workers: SIGTERM to rank 0's
    if tr '\0' '\n' <"/proc/$worker/environ" | grep -qx RANK=0; then
      kill -TERM "$worker" && echo "SIGTERM to rank 0 (pid $worker) after 4 steps"
    fi
  done
fi
wait $PID
CODE1=$?
timeout 75 "${FSDP[@]}" >"$DIR/fsdp-2.log" 2>&1
CODE2=$?
echo "preempted: exit $CODE1 (75 expected); resumed: exit $CODE2 (0 expected); 124: over its 60 / 75 s"
[ $CODE2 = 0 ] || tail -30 "$DIR/fsdp-2.log"
python3 - "$RUN3" "$FSDP_STEPS" <<'PY'
import json, sys
from tgnb.events import RUN_RESUMED, read_jsonl
run, steps = sys.argv[1], int(sys.argv[2])
print([e.data for e in read_jsonl(f"{run}/events.jsonl") if e.reason == RUN_RESUMED])
logged = sorted(json.loads(line)["step"] for line in open(f"{run}/metrics.jsonl"))
print("every step logged once:", logged == list(range(1, steps + 1)), len(logged), "rows")
PY
echo "== done in ${SECONDS} s"

#!/usr/bin/env bash
# tessera against PyTorch eager, one rank on 1 and on 2 threads, fp32 (or PRECISION=bf16: tessera's
# --precision bf16 against torch.autocast to bf16, the GEMMs in bf16 with fp32 accumulation and
# everything the optimizer holds in fp32 on both sides), AdamW, B=4, T=256, random
# tokens: tessera, Hugging Face's implementation (sdpa) and a plain PyTorch module with
# scaled_dot_product_attention (bench/llama/torch_llama.py), the three interleaved in each round
# so that machine drift hits them alike. Prints per run the median tokens/s of the steps after the
# warm-up, then per thread count each round's tessera / faster PyTorch ratio. FAMILY=llama (the
# default): a Llama-style decoder of ~100M parameters (L=12, C=768, 12 query heads over 4
# key/value heads, SwiGLU 2048, vocabulary 16384, untied head); FAMILY=gpt2: the engine's
# benchmark GPT-2 (L=6, C=512, 8 heads, vocabulary 4096, tied head). Both sides clip the gradient
# norm to 1.0 (tessera's default). Each round also times the step's GEMMs alone through the same
# path (OpenBLAS for fp32; bench_step_gemms, built beside tessera): no framework whose step is those GEMMs can
# run faster than that, so (GEMMs-alone tokens/s) / (faster PyTorch) is the ceiling of the ratio.
#
# Usage: bench/llama/vs_pytorch.sh [tessera] [python with torch and transformers]
#   env: FAMILY (llama), PRECISION (fp32), ROUNDS (3), STEPS (8), THREADS ("1 2")
# Takes ~10 minutes per round on 2 cores; wants a quiet machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(realpath "${1:-$here/../../build/apps/tessera/tessera}")
gemms=$(realpath -m "$(dirname "$bin")/../../bench/engine/bench_step_gemms")
[ -x "$gemms" ] || { echo "vs_pytorch.sh: no $gemms: pass the tessera of a build tree (build/apps/tessera/tessera), whose bench/engine/bench_step_gemms it runs" >&2; exit 2; }
py=${2:-python3}
rounds=${ROUNDS:-3}
steps=${STEPS:-8}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/config.json" <<JSON
{"model_type": "llama", "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
 "num_key_value_heads": 4, "intermediate_size": 2048, "vocab_size": 16384,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
 "tie_word_embeddings": false, "hidden_act": "silu"}
JSON
family=${FAMILY:-llama}
precision=${PRECISION:-fp32}
case $precision in fp32 | bf16) ;; *) echo "vs_pytorch.sh: PRECISION is fp32 or bf16, not $precision" >&2; exit 2 ;; esac
if [ "$family" = gpt2 ]; then
  vocab=4096
  model=(--layers 6 --dim 512 --heads 8 --vocab 4096)
  gemm_model=(--family gpt2 --layers 6 --dim 512 --heads 8 --vocab 4096)
  torch_model=(--family gpt2 --layers 6 --dim 512 --heads 8 --vocab 4096)
else
  vocab=16384
  model=(--model "$work/config.json")
  gemm_model=(--family llama)
  torch_model=(--family llama)
fi
python3 -c "import random,struct,sys
r=random.Random(0); v=int(sys.argv[2]); open(sys.argv[1],'wb').write(struct.pack('<200000H',*[r.randrange(v) for _ in range(200000)]))" "$work/tokens.bin" "$vocab"
echo "$family $precision: $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc); $("$py" -c 'import torch,transformers;print("torch",torch.__version__,"transformers",transformers.__version__)')"
tessera_run() {  # threads -> median tokens/s of steps 3..
  local m="$work/metrics.jsonl"
  rm -f "$m"
  "$bin" train "${model[@]}" --data "$work/tokens.bin" --seq 256 --batch 4 \
    --steps "$steps" --warmup 2 --threads "$1" --eval-every 0 --sample-tokens 0 --val-fraction 0 \
    --log-every 1 --metrics "$m" --cache-dir "$work/cache" --precision "$precision" \
    >"$work/tessera.log" 2>&1 ||
    { cat "$work/tessera.log"; exit 1; }
  python3 -c "import json,statistics,sys
r=[json.loads(l) for l in open(sys.argv[1]) if 'tokens_per_s' in l]
print(round(statistics.median(x['tokens_per_s'] for x in r if x['step']>=3)))" "$m"
}
torch_run() {  # impl threads -> tokens/s
  "$py" "$here/torch_llama.py" "${torch_model[@]}" --impl "$1" --threads "$2" --steps "$steps" \
    --warmup 2 --precision "$precision" |
    python3 -c "import json,sys; print(json.loads(sys.stdin.read())['tokens_per_s'])"
}
declare -A ratios
for r in $(seq 1 "$rounds"); do
  for t in ${THREADS:-1 2}; do
    a=$(tessera_run "$t")
    h=$(torch_run hf "$t")
    p=$(torch_run plain "$t")
    g=$("$gemms" "${gemm_model[@]}" --threads "$t" --rounds 3 --precision "$precision" |
      python3 -c "import json,sys; print(round(json.loads(sys.stdin.read())['tokens_per_s']))")
    ratio=$(python3 -c "print('%.2f' % ($a / max($h, $p)))")
    ceiling=$(python3 -c "print('%.2f' % ($g / max($h, $p)))")
    ratios[$t]="${ratios[$t]:-} $ratio"
    echo "round $r threads $t tok/s: tessera $a hf $h plain $p GEMMs alone $g | tessera / faster torch ${ratio}x, ceiling ${ceiling}x ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
for t in ${THREADS:-1 2}; do
  # shellcheck disable=SC2086 # the ratios split into arguments on purpose
  echo "threads $t: ratios${ratios[$t]}; median $(python3 -c "import statistics,sys; print('%.2f' % statistics.median(map(float, sys.argv[1:])))" ${ratios[$t]})x; rounds >= 1.3x: $(python3 -c "import sys; print(sum(float(x) >= 1.3 for x in sys.argv[1:]))" ${ratios[$t]}) of $rounds"
done

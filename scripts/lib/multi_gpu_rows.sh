# The several-GPU rows of scripts/gpu_check.sh (sourced by it; not run alone).
# One block of runs and one block of summary lines, for the day a machine with
# two or more GPUs is lent:
#   - mixbench allreduce over NCCL, half against float: busbw at the largest size;
#   - mixbench grad-sync of ResNet-50, the Transformer (and GPT-2 where the build
#     has --model gpt2), FP16 and FP32 gradients: time and busbw of one step's sync;
#   - ResNet-50, the Transformer (and GPT-2) in AMP on N ranks against 1 rank at
#     the same per-rank batch: scaling efficiency = N-rank rate / (N x 1-rank rate);
#   - ResNet-50 AMP on N ranks with --no-overlap against the overlapped default;
#   - ResNet-50 AMP on N ranks with --cuda-graph (each rank records its step).
# Every run starts through mixrun with the launcher given (the bundle's
# deps/openmpi/bin/mpirun on an air-gapped GPU machine), so the same rows run
# on the CPU with several ranks and tiny sizes (gpu_check.sh --multi-rank-cpu N),
# which is how they are tested before any multi-GPU lend (tests/e2e/test_multi_gpu_rows.sh).
#
# multi_rows_run DEVICE RANKS BUILD OUT LAUNCHER
#   DEVICE cuda or cpu; RANKS the N of the N-rank runs (under 2: every row says
#   "needs 2+ GPUs" and nothing runs); BUILD holds mixtrain, mixbench, mixrun;
#   logs go to OUT/multi_*.log. Uses the caller's `limit SECONDS COMMAND...`.
# multi_rows_summary   the summary lines (stdout)
# multi_rows_ok        exit 0 when every run that ran exited 0 (none ran: 0)

multi_rows_run() {
  mr_device="$1" mr_ranks="$2" mr_build="$3" mr_out="$4" mr_launcher="$5"
  mr_failed=0
  mr_unit="GPUs"
  [ "$mr_device" = cpu ] && mr_unit="CPU ranks"
  mr_needs=""
  if [ "$mr_ranks" -lt 2 ]; then
    mr_needs="needs 2+ GPUs ($mr_ranks visible)"
    return 0
  fi
  if [ -z "$mr_launcher" ]; then
    mr_needs="no launcher: no mpirun on PATH and no bundle with deps/openmpi (scripts/gpu_bundle.sh)"
    mr_failed=1
    return 0
  fi
  # GPT-2 rows where this build's mixtrain and mixbench grad-sync have --model gpt2.
  mr_gpt2=""
  "$mr_build/mixtrain" --help 2>/dev/null | grep -q -- "--model [^ ]*gpt2" &&
    "$mr_build/mixbench" grad-sync --help 2>/dev/null | grep -q -- "--model [^ ]*gpt2" && mr_gpt2=1
  rm -f "$mr_out"/multi_*.log "$mr_out"/multi_*.jsonl "$mr_out"/multi_*.csv

  # Sizes: the single-GPU rows' on a GPU; tiny ones on the CPU (the rows' test).
  if [ "$mr_device" = cuda ]; then
    mr_ar_args=(-b 1M -e 256M -f 4 -n 20 -w 5)
    mr_gs_args=(-n 20 -w 5)
    mr_r50_args=(--data-format nhwc --synthetic-size 256 --synthetic-classes 1000 --batch-size 64
                 --benchmark-warmup 10 --steps 30)
    mr_tf_args=(--layers 6 --d-model 512 --heads 8 --context 256 --vocab 32768 --batch-size 32
                --optimizer adamw --benchmark-warmup 10 --steps 40)
    mr_gpt2_args=(--synthetic-size 64 --batch-size 8 --optimizer adamw --benchmark-warmup 5 --steps 20)
    mr_limit=240
  else
    mr_ar_args=(-b 1K -e 1M -f 32 -n 5 -w 2)
    mr_gs_args=(-n 2 -w 1)
    mr_r50_args=(--image-size 32 --synthetic-size 64 --synthetic-classes 10 --batch-size 4
                 --benchmark-warmup 1 --steps 3)
    mr_tf_args=(--layers 2 --d-model 64 --heads 2 --context 32 --vocab 256 --batch-size 4
                --optimizer adamw --benchmark-warmup 1 --steps 3)
    mr_gpt2_args=(--layers 1 --d-model 64 --heads 2 --context 32 --batch-size 2 --optimizer adamw
                  --benchmark-warmup 1 --steps 2)
    mr_limit=120
  fi

  echo "gpu_check: several-rank rows on $mr_ranks $mr_unit through $mr_launcher (logs: $mr_out/multi_*.log)"
  mr_launch() {  # ranks, log name, program, args...: the program on that many ranks through mixrun
    local n="$1" name="$2"; shift 2
    limit "$mr_limit" "$mr_build/mixrun" -n "$n" --mpirun "$mr_launcher" -- "$@" >"$mr_out/$name.log" 2>&1
  }
  mr_launch "$mr_ranks" multi_allreduce "$mr_build/mixbench" allreduce --device "$mr_device" "${mr_ar_args[@]}" \
    -d half,float -o sum --check --csv "$mr_out/multi_allreduce.csv"
  mr_ar_rc=$?
  local model precision reduce
  mr_gs_models="resnet50 transformer"
  [ -n "$mr_gpt2" ] && mr_gs_models="$mr_gs_models gpt2"
  for model in $mr_gs_models; do
    for precision in amp fp32; do
      reduce=fp16
      [ "$precision" = fp32 ] && reduce=fp32
      mr_launch "$mr_ranks" "multi_gradsync_${model}_$reduce" "$mr_build/mixbench" grad-sync --device "$mr_device" \
        --model "$model" --precision "$precision" --grad-reduce "$reduce" "${mr_gs_args[@]}" \
        --csv "$mr_out/multi_gradsync_${model}_$reduce.csv"
      printf -v "mr_gs_rc_${model}_$reduce" '%s' $?
    done
  done
  mr_train() {  # ranks, name, model, extra args...: AMP benchmark run, metrics to OUT/NAME.jsonl
    local n="$1" name="$2" model="$3"; shift 3
    mr_launch "$n" "$name" "$mr_build/mixtrain" --device "$mr_device" --precision amp --model "$model" \
      --data synthetic --benchmark --eval false "$@" --metrics "$mr_out/$name.jsonl"
  }
  mr_train 1 multi_resnet50_1 resnet50 "${mr_r50_args[@]}"; mr_r50_1_rc=$?
  mr_train "$mr_ranks" multi_resnet50_n resnet50 "${mr_r50_args[@]}"; mr_r50_n_rc=$?
  mr_train 1 multi_transformer_1 transformer "${mr_tf_args[@]}"; mr_tf_1_rc=$?
  mr_train "$mr_ranks" multi_transformer_n transformer "${mr_tf_args[@]}"; mr_tf_n_rc=$?
  if [ -n "$mr_gpt2" ]; then
    mr_train 1 multi_gpt2_1 gpt2 "${mr_gpt2_args[@]}"; mr_gpt2_1_rc=$?
    mr_train "$mr_ranks" multi_gpt2_n gpt2 "${mr_gpt2_args[@]}"; mr_gpt2_n_rc=$?
  fi
  # The N-rank ResNet-50 run above overlaps the bucket all-reduces with backward
  # (the default); this one waits for backward first.
  mr_train "$mr_ranks" multi_resnet50_n_no_overlap resnet50 "${mr_r50_args[@]}" --no-overlap; mr_r50_noov_rc=$?
  # Each rank records its step as a CUDA graph (NCCL calls inside it); on the CPU
  # the flag runs op by op, so the row checks only that the flag passes there.
  mr_train "$mr_ranks" multi_resnet50_n_cudagraph resnet50 "${mr_r50_args[@]}" --cuda-graph; mr_r50_cg_rc=$?

  local rc
  for rc in $mr_ar_rc $mr_r50_1_rc $mr_r50_n_rc $mr_tf_1_rc $mr_tf_n_rc $mr_r50_noov_rc $mr_r50_cg_rc \
            ${mr_gpt2_1_rc:-0} ${mr_gpt2_n_rc:-0}; do
    [ "$rc" -eq 0 ] || mr_failed=1
  done
  for model in $mr_gs_models; do
    for reduce in fp16 fp32; do
      rc="mr_gs_rc_${model}_$reduce"
      [ "${!rc}" -eq 0 ] || mr_failed=1
    done
  done
  return 0
}

# The summary's field of a metrics file (mixtrain --metrics), or n/a.
mr_field() {  # file, field
  /usr/bin/env python3 -c "import json,sys
s=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
s=[l for l in s if l.get('summary')]
v=s[-1].get(sys.argv[2]) if s else None
print('n/a' if v is None else (f'{v:.1f}' if isinstance(v, float) else v))" "$1" "$2" 2>/dev/null || echo n/a
}
# The last CSV row's column (mixbench --csv), or n/a.
mr_csv() {  # file, column
  /usr/bin/env python3 -c "import csv,sys
r=list(csv.DictReader(open(sys.argv[1])))
print(r[-1][sys.argv[2]] if r and r[-1].get(sys.argv[2]) else 'n/a')" "$1" "$2" 2>/dev/null || echo n/a
}
# busbw (GB/s, out of place) of the largest size of one dtype in a mixbench allreduce log, or n/a.
mr_busbw() {  # log, dtype
  awk -v t="$2" '$1 ~ /^[0-9]+$/ && $3 == t { bw = $7; size = $1 } END { if (bw == "") print "n/a"; else print bw }' \
    "$1" 2>/dev/null || echo n/a
}
mr_largest() {  # log: the largest size the allreduce rows reached, in bytes
  awk '$1 ~ /^[0-9]+$/ && $3 != "" { s = $1 } END { print (s == "" ? "n/a" : s) }' "$1" 2>/dev/null || echo n/a
}
# N-rank rate / (N x 1-rank rate), or n/a.
mr_efficiency() {  # one-rank rate, n-rank rate, n
  /usr/bin/env python3 -c "import sys
try: print(f'{float(sys.argv[2]) / (int(sys.argv[3]) * float(sys.argv[1])):.2f}')
except Exception: print('n/a')" "$1" "$2" "$3"
}
mr_ratio() {  # a, b: b / a, or n/a
  /usr/bin/env python3 -c "import sys
try: print(f'{float(sys.argv[2]) / float(sys.argv[1]):.2f}')
except Exception: print('n/a')" "$1" "$2"
}

multi_rows_summary() {
  local n="$mr_ranks" u="$mr_unit" line="%-40s %s\n"
  if [ -n "$mr_needs" ]; then
    echo "  -- several GPUs (scripts/lib/multi_gpu_rows.sh) --"
    for row in "allreduce busbw half / float" "grad-sync fp16, fp32" \
               "ResNet-50 AMP scaling efficiency" "Transformer AMP scaling efficiency" "GPT-2 AMP scaling efficiency" \
               "ResNet-50 AMP no-overlap / overlap" "ResNet-50 AMP --cuda-graph, N ranks"; do
      printf "  $line" "$row" "$mr_needs"
    done
    return 0
  fi
  echo "  -- several GPUs: $n ${u} against 1 (${mr_device}; scripts/lib/multi_gpu_rows.sh) --"
  local out="$mr_out" backend="NCCL"
  [ "$mr_device" = cpu ] && backend="MPI"
  printf "  $line" "allreduce $backend busbw GB/s half / float" \
    "$(mr_busbw "$out/multi_allreduce.log" half) / $(mr_busbw "$out/multi_allreduce.log" float) at $(mr_largest "$out/multi_allreduce.log") B, $(grep -o "Out of bounds values : [0-9]* [A-Z]*" "$out/multi_allreduce.log" 2>/dev/null || echo "no check") (exit $mr_ar_rc)"
  local model reduce rc
  for model in $mr_gs_models; do
    for reduce in fp16 fp32; do
      rc="mr_gs_rc_${model}_$reduce"
      printf "  $line" "grad-sync $model $reduce ms, GB/s" \
        "$(mr_ratio 1000 "$(mr_csv "$out/multi_gradsync_${model}_$reduce.csv" time_us)"), $(mr_csv "$out/multi_gradsync_${model}_$reduce.csv" busbw) (exit ${!rc})"
    done
  done
  [ -n "$mr_gpt2" ] || printf "  $line" "grad-sync gpt2" "not in this build (no --model gpt2)"
  local r1 rn
  r1=$(mr_field "$out/multi_resnet50_1.jsonl" samples_per_s_overall)
  rn=$(mr_field "$out/multi_resnet50_n.jsonl" samples_per_s_overall)
  printf "  $line" "ResNet-50 AMP img/s 1 / $n $u" "$r1 / $rn (exit $mr_r50_1_rc / $mr_r50_n_rc)"
  printf "  $line" "ResNet-50 AMP scaling efficiency" "$(mr_efficiency "$r1" "$rn" "$n")"
  r1=$(mr_field "$out/multi_transformer_1.jsonl" tokens_per_s_overall)
  rn=$(mr_field "$out/multi_transformer_n.jsonl" tokens_per_s_overall)
  printf "  $line" "Transformer AMP tok/s 1 / $n $u" "$r1 / $rn (exit $mr_tf_1_rc / $mr_tf_n_rc)"
  printf "  $line" "Transformer AMP scaling efficiency" "$(mr_efficiency "$r1" "$rn" "$n")"
  if [ -n "$mr_gpt2" ]; then
    r1=$(mr_field "$out/multi_gpt2_1.jsonl" tokens_per_s_overall)
    rn=$(mr_field "$out/multi_gpt2_n.jsonl" tokens_per_s_overall)
    printf "  $line" "GPT-2 AMP tok/s 1 / $n $u" "$r1 / $rn (exit $mr_gpt2_1_rc / $mr_gpt2_n_rc)"
    printf "  $line" "GPT-2 AMP scaling efficiency" "$(mr_efficiency "$r1" "$rn" "$n")"
  else
    printf "  $line" "GPT-2 AMP scaling efficiency" "not in this build (no --model gpt2)"
  fi
  local ov no
  ov=$(mr_field "$out/multi_resnet50_n.jsonl" step_ms)
  no=$(mr_field "$out/multi_resnet50_n_no_overlap.jsonl" step_ms)
  printf "  $line" "ResNet-50 AMP step ms, overlap / not" "$ov / $no (exit $mr_r50_n_rc / $mr_r50_noov_rc)"
  printf "  $line" "  no-overlap / overlap step time" "$(mr_ratio "$ov" "$no")"
  local note=""
  grep -q "could not \(record\|instantiate\)" "$out/multi_resnet50_n_cudagraph.log" 2>/dev/null &&
    note=" (NOT recorded: ran op by op)"
  [ "$mr_device" = cpu ] && note=" (CPU: op by op)"
  printf "  $line" "ResNet-50 AMP --cuda-graph img/s" \
    "$(mr_field "$out/multi_resnet50_n_cudagraph.jsonl" samples_per_s_overall) (exit $mr_r50_cg_rc)$note"
}

multi_rows_ok() { [ "${mr_failed:-0}" -eq 0 ]; }

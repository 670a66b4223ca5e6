#!/bin/sh
# The teacher data of the larger drafters (docs/training.md, "Drafters at scale"), in resumable stages.
# Every stage skips what is already on disk, so rerunning this script continues where it stopped.
# Run it in the background on one core:
#   setsid nohup chrt --idle 0 env OMP_NUM_THREADS=1 sh scripts/scale_data.sh > data/scale.log 2>&1 < /dev/null &
# Pause it while timing anything (pkill -STOP -f specdec.distill; pkill -CONT -f specdec.distill to go on).
set -e
DATA=${DATA:-data/scale}
P="${PY:-.venv/bin/python} -m specdec.distill"
# Part 0: templated prompts in five domains, prompts over long documents and over this machine's documentation,
# and 8M characters of raw text to label.
$P corpus --data "$DATA" --prompts-per-domain 1500 --eval-per-domain 16 --text-chars 8000000 \
    --long-prompts 600 --long-eval 16 --system-prompts 600 --system-eval 16
# Part 1: self-instruct prompts and two-turn chats, then their greedy answers first (the new sources). The
# sources stage keeps what it wrote batch by batch, so its --batch-size must stay the same across resumes.
$P sources --data "$DATA" --self-prompts 2000 --self-eval 32 --chat-prompts 1000 --chat-eval 16 --batch-size 64
$P teacher --data "$DATA" --part 1 --text-shards 0
# Part 0's greedy answers and its labelled raw text.
$P teacher --data "$DATA"
# Part 0 again, answers sampled at 0.9 (people chat at a temperature).
$P teacher --data "$DATA" --sampled-passes 1 --sampling-temperature 0.9 --text-shards 0
# Part 2: new templated prompts, greedy.
$P corpus --data "$DATA" --prompts-per-domain 1500 --eval-per-domain 16 --text-chars 8000000 \
    --long-prompts 600 --long-eval 16 --system-prompts 600 --system-eval 16 --parts 3
$P teacher --data "$DATA" --part 2 --text-shards 0

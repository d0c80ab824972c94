#!/usr/bin/env bash
# Runs the command given as arguments beside two CPU-bound processes (a busy CI machine), which end with it however it
# ends; exits with the command's status.
set -uo pipefail
burners=()
for _ in 1 2; do
    python3 -c "while True: pass" &
    burners+=($!)
done
trap 'kill "${burners[@]}" 2>/dev/null' EXIT INT TERM
"$@"

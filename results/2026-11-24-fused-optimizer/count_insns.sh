#!/bin/bash
# count_insns.sh OBJ SYMBOL-substring: counts of vector sqrt/div instructions in the function
o=$1; sym=$2
start=$(nm -nC $o | grep -F "$sym(" | head -1 | awk '{print $1}')
next=$(nm -nC $o | grep -A1 -F "$sym(" | tail -1 | awk '{print $1}')
fn=$(mktemp); trap 'rm -f "$fn"' EXIT
objdump -d --no-show-raw-insn $o --start-address=0x$start --stop-address=0x$next > "$fn"
printf "%-40s vsqrtps %4d vdivps %4d vsqrtss %4d vdivss %4d insns %5d\n" "$sym" $(grep -c vsqrtps "$fn") $(grep -c vdivps "$fn") $(grep -c vsqrtss "$fn") $(grep -c vdivss "$fn") $(grep -c "^ " "$fn")

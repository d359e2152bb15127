# Code written at run time runs as written (docs/target.md §2: fetch reads memory at every issue).
# The loop body's first instruction, `setzi $m3, 7`, is overwritten on the first pass with the
# word of `setzi $m3, 9` (copied from `replacement`, which never runs); the second pass must issue
# the new word although the old one was decoded before: $m4 = 7 + 9 = 16 (a stale decode: 14).
# Timing (docs/target.md §3): one supervisor issue per cycle, no workers.
#   setzi@0 setzi@1, 2 x (setzi, add, setzi, ld32, setzi, st32, brnzdec) @2..15,
#   setzi@16, st32@17, sync 15 @18; host sync releases at 18 + 90 = 108.
main:
    setzi $m2, 1
    setzi $m4, 0
loop:
patch:
    setzi $m3, 7
    add $m4, $m4, $m3
    setzi $m5, replacement
    ld32 $m6, $m5, $m15, 0
    setzi $m5, patch
    st32 $m6, $m5, $m15, 0
    brnzdec $m2, loop
    setzi $m5, result
    st32 $m4, $m5, $m15, 0
    sync 15
    halt
replacement:
    setzi $m3, 9
.org 0x60000
result: .word 0

# Integer loop on the supervisor: sum 3 eleven times (brnzdec runs the body for 10..0).
# Timing (docs/target.md §3): the supervisor issues one instruction per cycle without workers.
#   setzi@0 setzi@1, 11 x (add, brnzdec) @2..23, setzi@24, st32@25, sync 15 @26
#   host sync releases at 26 + 90 = 116.
main:
    setzi $m1, 10
    setzi $m2, 0
loop:
    add $m2, $m2, 3
    brnzdec $m1, loop
    setzi $m3, result
    st32 $m2, $m3, $m15, 0
    sync 15
    halt
.org 0x60000
result: .word 0

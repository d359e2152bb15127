# One worker does f16v4 and f32v2 arithmetic.
# Timing: setzi@0 setzi@1 run@2 -> worker slot 0 issues at 6,12,...; supervisor: sync 2 @3 waits.
# Worker issues 11 instructions: 6,12,...,66 (exit @66). Supervisor: sync 2 @67, sync 15 @68,
# release 68 + 90 = 158.
main:
    setzi $m0, worker
    setzi $m1, data
    run $m0, $m1
    sync 2
    sync 15
    halt
worker:
    ld64 $a0, $m1, $m15, 0
    ld64 $a2, $m1, $m15, 8
    f16v4add $a4, $a0, $a2
    f16v4mul $a6, $a0, $a2
    st64 $a4, $m1, $m15, 16
    st64 $a6, $m1, $m15, 24
    ld64 $a0, $m1, $m15, 32
    nop                                      # the bundle must be 8-byte aligned
    { st64 $a0, $m1, $m15, 40 ; f32v2mul $a8, $a0, $a0 }
    st64 $a8, $m1, $m15, 48
    exit
.org 0x60000
data:
    .half 0x3c00, 0x4000, 0xc200, 0x7bff   # 1.0, 2.0, -3.0, 65504
    .half 0x3800, 0x3c00, 0x4000, 0x7bff   # 0.5, 1.0, 2.0, 65504
    .space 16                              # f16v4add, f16v4mul results
    .word 0x40400000, 0xbf800000           # 3.0f, -1.0f
    .space 16                              # copy, squares

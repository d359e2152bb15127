# A worker converts four halves to FP8 (F143) with scale 0 and scale 2, and back.
main:
    setzi $m0, worker
    setzi $m1, data
    run $m0, $m1
    sync 2
    sync 15
    halt
worker:
    ld64 $a0, $m1, $m15, 0
    setzi $m2, 0
    uput 9, $m2          # FP_NFMT = F143
    uput 10, $m2         # FP_SCL = 0
    f16v4tof8 $a2, $a0
    sta32 $a2, $m1, $m15, 8
    setzi $m2, 2
    uput 10, $m2         # FP_SCL = 2
    f16v4tof8 $a3, $a0
    sta32 $a3, $m1, $m15, 12
    f8v4tof16 $a4, $a3
    st64 $a4, $m1, $m15, 16
    exit
.org 0x60000
data:
    .half 0x3c00, 0xc100, 0x5b80, 0x63d0   # 1.0, -2.5, 240.0, 1000.0
    .space 16

# Tile 1 points its incoming pointer at `buf` and selects tile 0 from cycle 92 + MUXDELAY.
# The first word arrives at 104, so MUXDELAY = 12 is exact and 13 is one cycle late.
main:
    sync 3
    setzi $m1, buf
    put 0xa4, $m1
    delayxpic MUXDELAY, 0, 0
    sync 3
    sync 15
    halt
.org 0x60000
buf: .space 16

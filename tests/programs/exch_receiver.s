# Tile 1 expects four words, points its incoming pointer at `buf` and selects tile 0 from cycle
# 94 + MUXDELAY. The first word arrives at 104, so MUXDELAY = 10 is exact and 11 is one cycle late.
# Without the count ($INCOMING_DCOUNT) the closing sync would fault (docs/target.md §5).
main:
    sync 3
    setzi $m2, 4
    put 0xa6, $m2
    setzi $m1, buf
    put 0xa4, $m1
    delayxpic MUXDELAY, 0, 0
    sync 3
    sync 15
    halt
.org 0x60000
buf: .space 16

/* A small object shaped as a Go program with cgo: the real
 * runtime.asmcgocall.abi0 code and Go build id note of a Go 1.x build
 * (tests/fixtures/cgo_leak), between runtime.text and runtime.etext. */
    .section .note.go.buildid,"a",@note
    .p2align 2
    .byte 4,0,0,0,83,0,0,0,4,0,0,0,71,111,0,0
    .byte 53,115,45,56,80,84,100,111,120,106,49,121,78,88,116,105
    .byte 105,104,75,75,47,113,78,107,73,116,117,106,56,52,100,74
    .byte 120,45,84,49,56,70,53,118,97,47,105,108,56,102,110,111
    .byte 98,80,95,70,50,80,54,85,76,81,116,118,48,81,47,75
    .byte 67,102,55,80,121,80,78,113,81,100,121,102,83,87,73,118
    .byte 101,100,99,0
    .text
    .globl runtime.text
runtime.text:
    .byte 0xc3
    .p2align 5
    .type runtime.asmcgocall.abi0,@function
runtime.asmcgocall.abi0:
    .byte 72,139,68,36,8,72,139,92,36,16,72,137,226,100,72,139
    .byte 60,37,248,255,255,255,72,131,255,0,116,103,76,139,71,48
    .byte 73,139,112,80,72,57,247,116,90,73,139,48,72,57,247,116
    .byte 82,232,106,211,255,255,100,72,137,52,37,248,255,255,255,72
    .byte 139,102,56,72,131,236,64,72,131,228,240,72,137,124,36,48
    .byte 72,139,127,8,72,41,215,72,137,124,36,40,72,137,223,72
    .byte 137,217,255,208,72,139,124,36,48,72,139,119,8,72,43,116
    .byte 36,40,100,72,137,60,37,248,255,255,255,72,137,244,137,68
    .byte 36,24,195,72,131,236,64,72,131,228,240,72,199,68,36,48
    .byte 0,0,0,0,72,137,84,36,40,72,137,223,72,137,217,255
    .byte 208,72,139,116,36,40,72,137,244,137,68,36,24,195
    .size runtime.asmcgocall.abi0, 174
    .globl main
    .type main,@function
main:
    xor %eax,%eax
    ret
    .size main, 3
    .globl runtime.etext
runtime.etext:
    .byte 0xc3
    .section .note.GNU-stack,"",@progbits

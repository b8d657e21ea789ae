//go:build amd64 && !purego

#include "textflag.h"

// PFAHEAD is how far past the four rows a kernel is reading (bytes) it
// prefetches: the rows of a block are read as four streams, which the
// hardware prefetchers follow poorly; software prefetches walk the bytes
// of the next block linearly instead, 256 per 256 bytes consumed.
#define PFAHEAD 8192

// AVX-512 kernels (F, BW, DQ, VL, VNNI, GFNI). Each computes four dot
// products of consecutive weight rows with one input vector, so the input
// is loaded once per four rows; the Go wrappers in dot_amd64.go document the
// contracts and are tested against the plain Go references.

// Lane index tables for VPERMD/VPERMPS.
DATA idx2x8<>+0x00(SB)/8, $0x0000000000000000
DATA idx2x8<>+0x08(SB)/8, $0x0000000000000000
DATA idx2x8<>+0x10(SB)/8, $0x0000000000000000
DATA idx2x8<>+0x18(SB)/8, $0x0000000000000000
DATA idx2x8<>+0x20(SB)/8, $0x0000000100000001
DATA idx2x8<>+0x28(SB)/8, $0x0000000100000001
DATA idx2x8<>+0x30(SB)/8, $0x0000000100000001
DATA idx2x8<>+0x38(SB)/8, $0x0000000100000001
GLOBL idx2x8<>(SB), RODATA|NOPTR, $64

// Even and odd lane indexes over two 16-lane tables.
DATA idxEven<>+0x00(SB)/8, $0x0000000200000000
DATA idxEven<>+0x08(SB)/8, $0x0000000600000004
DATA idxEven<>+0x10(SB)/8, $0x0000000a00000008
DATA idxEven<>+0x18(SB)/8, $0x0000000e0000000c
DATA idxEven<>+0x20(SB)/8, $0x0000001200000010
DATA idxEven<>+0x28(SB)/8, $0x0000001600000014
DATA idxEven<>+0x30(SB)/8, $0x0000001a00000018
DATA idxEven<>+0x38(SB)/8, $0x0000001e0000001c
GLOBL idxEven<>(SB), RODATA|NOPTR, $64

DATA idxOdd<>+0x00(SB)/8, $0x0000000300000001
DATA idxOdd<>+0x08(SB)/8, $0x0000000700000005
DATA idxOdd<>+0x10(SB)/8, $0x0000000b00000009
DATA idxOdd<>+0x18(SB)/8, $0x0000000f0000000d
DATA idxOdd<>+0x20(SB)/8, $0x0000001300000011
DATA idxOdd<>+0x28(SB)/8, $0x0000001700000015
DATA idxOdd<>+0x30(SB)/8, $0x0000001b00000019
DATA idxOdd<>+0x38(SB)/8, $0x0000001f0000001d
GLOBL idxOdd<>(SB), RODATA|NOPTR, $64

// HSUM4 reduces the float32 accumulators Z0..Z3 to their four lane sums in
// X0 (Z4..Z7 clobbered).
#define HSUM4 \
	VEXTRACTF32X8 $1, Z0, Y4; \
	VEXTRACTF32X8 $1, Z1, Y5; \
	VEXTRACTF32X8 $1, Z2, Y6; \
	VEXTRACTF32X8 $1, Z3, Y7; \
	VADDPS        Y4, Y0, Y0; \
	VADDPS        Y5, Y1, Y1; \
	VADDPS        Y6, Y2, Y2; \
	VADDPS        Y7, Y3, Y3; \
	VHADDPS       Y1, Y0, Y0; \
	VHADDPS       Y3, Y2, Y2; \
	VHADDPS       Y2, Y0, Y0; \
	VEXTRACTF128  $1, Y0, X1; \
	VADDPS        X1, X0, X0

// Q8ROW is one row of q8Dot4AVX512 over a 64-byte chunk: the weights
// (masked by K1) made unsigned by flipping their top bit (one masked
// load-XOR), times the int8
// inputs in Z4, accumulated in int32 from the bias Z6, converted and
// scaled by the block scales Z5 into the float32 accumulator acc.
#define Q8ROW(addr, t, a, acc) \
	VPXORD.Z    addr, Z31, K1, t; \
	VMOVDQA64   Z6, a; \
	VPDPBUSD    Z4, t, a; \
	VCVTDQ2PS   a, a; \
	VFMADD231PS Z5, a, acc

// func q8Dot4AVX512(w *byte, stride, n int, x *byte, d *float32, s *int32, nq int, scale, out *float32)
//
// For nq blocks of four rows from w (stride bytes between rows, blocks
// 4·stride apart) writes out[4k+i] = scale[4k+i]·(row 4k+i)·x.
// Its prefetches go to L2 (PREFETCHT1): against PREFETCHT0 the MoE decode
// benchmark (1024- and 768-byte rows) read +0.1 to +3.1 points (median
// +2.1) more of the probe in nine alternated pairs, the dense 1B q8_row
// token no less (docs/hybrid.md, CPU speed).
TEXT ·q8Dot4AVX512(SB), NOSPLIT, $0-72
	MOVL         $0x80808080, R9
	VPBROADCASTD R9, Z31
	VMOVDQU32    idx2x8<>(SB), Z30
	MOVL         $0x0101, R9
	KMOVW        R9, K2
	MOVQ         w+0(FP), R12
	MOVQ         stride+8(FP), BX
	XORQ         R13, R13 // 16 × block index

q8block:
	MOVQ   R12, AX
	MOVQ   n+16(FP), CX
	MOVQ   x+24(FP), SI
	MOVQ   d+32(FP), DI
	MOVQ   s+40(FP), R8
	LEAQ   (AX)(BX*2), DX
	ADDQ   BX, DX
	LEAQ   PFAHEAD(DX)(BX*1), R11
	KXNORQ K1, K1, K1
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3

	MOVQ CX, R10
	SHRQ $6, R10
	JZ   q8tail

q8loop:
	PREFETCHT1 (R11)
	PREFETCHT1 64(R11)
	PREFETCHT1 128(R11)
	PREFETCHT1 192(R11)
	ADDQ       $256, R11
	VMOVDQU8 (SI), Z4
	VMOVQ    (DI), X5
	VPERMD   Z5, Z30, Z5
	VMOVQ    (R8), X6
	VPERMD.Z Z6, Z30, K2, Z6
	Q8ROW((AX), Z7, Z8, Z0)
	Q8ROW((AX)(BX*1), Z9, Z10, Z1)
	Q8ROW((AX)(BX*2), Z11, Z12, Z2)
	Q8ROW((DX), Z13, Z14, Z3)
	ADDQ     $64, AX
	ADDQ     $64, DX
	ADDQ     $64, SI
	ADDQ     $8, DI
	ADDQ     $8, R8
	DECQ     R10
	JNZ      q8loop

q8tail:
	ANDQ  $63, CX
	JZ    q8done
	MOVQ  $1, R9
	SHLQ  CX, R9
	DECQ  R9
	KMOVQ R9, K1
	VMOVDQU8 (SI), Z4
	VMOVQ    (DI), X5
	VPERMD   Z5, Z30, Z5
	VMOVQ    (R8), X6
	VPERMD.Z Z6, Z30, K2, Z6
	Q8ROW((AX), Z7, Z8, Z0)
	Q8ROW((AX)(BX*1), Z9, Z10, Z1)
	Q8ROW((AX)(BX*2), Z11, Z12, Z2)
	Q8ROW((DX), Z13, Z14, Z3)

q8done:
	HSUM4
	MOVQ    scale+56(FP), AX
	VMULPS  (AX)(R13*1), X0, X0
	MOVQ    out+64(FP), AX
	VMOVUPS X0, (AX)(R13*1)
	LEAQ    (R12)(BX*4), R12
	ADDQ    $16, R13
	MOVQ    nq+48(FP), R9
	SHLQ    $4, R9
	CMPQ    R13, R9
	JLT     q8block
	VZEROUPPER
	RET

// Code extraction for 16 groups: VPSHUFB gathers into dword lane j the two
// code bytes holding bits 5j..5j+4 (bytes 5j/8 and 5j/8+1 of the 10), and
// VPSRLVD shifts them down by 5j%8.
DATA codeBytes<>+0x00(SB)/8, $0x8080010080800100
DATA codeBytes<>+0x08(SB)/8, $0x8080020180800201
DATA codeBytes<>+0x10(SB)/8, $0x8080040380800302
DATA codeBytes<>+0x18(SB)/8, $0x8080050480800403
DATA codeBytes<>+0x20(SB)/8, $0x8080060580800605
DATA codeBytes<>+0x28(SB)/8, $0x8080070680800706
DATA codeBytes<>+0x30(SB)/8, $0x8080090880800807
DATA codeBytes<>+0x38(SB)/8, $0x80800a0980800908
GLOBL codeBytes<>(SB), RODATA|NOPTR, $64

DATA codeShift16<>+0x00(SB)/8, $0x0000000500000000
DATA codeShift16<>+0x08(SB)/8, $0x0000000700000002
DATA codeShift16<>+0x10(SB)/8, $0x0000000100000004
DATA codeShift16<>+0x18(SB)/8, $0x0000000300000006
DATA codeShift16<>+0x20(SB)/8, $0x0000000500000000
DATA codeShift16<>+0x28(SB)/8, $0x0000000700000002
DATA codeShift16<>+0x30(SB)/8, $0x0000000100000004
DATA codeShift16<>+0x38(SB)/8, $0x0000000300000006
GLOBL codeShift16<>(SB), RODATA|NOPTR, $64

// Lanes 4k..4k+3 take element 4·0+k: the scales of chunk 0 of 4.
DATA chunkIdx0<>+0x00(SB)/8, $0x0000000000000000
DATA chunkIdx0<>+0x08(SB)/8, $0x0000000000000000
DATA chunkIdx0<>+0x10(SB)/8, $0x0000000100000001
DATA chunkIdx0<>+0x18(SB)/8, $0x0000000100000001
DATA chunkIdx0<>+0x20(SB)/8, $0x0000000200000002
DATA chunkIdx0<>+0x28(SB)/8, $0x0000000200000002
DATA chunkIdx0<>+0x30(SB)/8, $0x0000000300000003
DATA chunkIdx0<>+0x38(SB)/8, $0x0000000300000003
GLOBL chunkIdx0<>(SB), RODATA|NOPTR, $64

// Lanes 4k..4k+3 take element 4·1+k: the scales of chunk 1 of 4.
DATA chunkIdx1<>+0x00(SB)/8, $0x0000000400000004
DATA chunkIdx1<>+0x08(SB)/8, $0x0000000400000004
DATA chunkIdx1<>+0x10(SB)/8, $0x0000000500000005
DATA chunkIdx1<>+0x18(SB)/8, $0x0000000500000005
DATA chunkIdx1<>+0x20(SB)/8, $0x0000000600000006
DATA chunkIdx1<>+0x28(SB)/8, $0x0000000600000006
DATA chunkIdx1<>+0x30(SB)/8, $0x0000000700000007
DATA chunkIdx1<>+0x38(SB)/8, $0x0000000700000007
GLOBL chunkIdx1<>(SB), RODATA|NOPTR, $64

// Lanes 4k..4k+3 take element 4·2+k: the scales of chunk 2 of 4.
DATA chunkIdx2<>+0x00(SB)/8, $0x0000000800000008
DATA chunkIdx2<>+0x08(SB)/8, $0x0000000800000008
DATA chunkIdx2<>+0x10(SB)/8, $0x0000000900000009
DATA chunkIdx2<>+0x18(SB)/8, $0x0000000900000009
DATA chunkIdx2<>+0x20(SB)/8, $0x0000000a0000000a
DATA chunkIdx2<>+0x28(SB)/8, $0x0000000a0000000a
DATA chunkIdx2<>+0x30(SB)/8, $0x0000000b0000000b
DATA chunkIdx2<>+0x38(SB)/8, $0x0000000b0000000b
GLOBL chunkIdx2<>(SB), RODATA|NOPTR, $64

// Lanes 4k..4k+3 take element 4·3+k: the scales of chunk 3 of 4.
DATA chunkIdx3<>+0x00(SB)/8, $0x0000000c0000000c
DATA chunkIdx3<>+0x08(SB)/8, $0x0000000c0000000c
DATA chunkIdx3<>+0x10(SB)/8, $0x0000000d0000000d
DATA chunkIdx3<>+0x18(SB)/8, $0x0000000d0000000d
DATA chunkIdx3<>+0x20(SB)/8, $0x0000000e0000000e
DATA chunkIdx3<>+0x28(SB)/8, $0x0000000e0000000e
DATA chunkIdx3<>+0x30(SB)/8, $0x0000000f0000000f
DATA chunkIdx3<>+0x38(SB)/8, $0x0000000f0000000f
GLOBL chunkIdx3<>(SB), RODATA|NOPTR, $64

// exp2 on [-1/2, 1/2]: Taylor coefficients of 2^f = e^(f·ln2), degree 7
// (truncation error 5e-9 relative), for the q4tp ladders.
DATA exp2c0<>+0(SB)/4, $0x3f800000
GLOBL exp2c0<>(SB), RODATA|NOPTR, $4
DATA exp2c1<>+0(SB)/4, $0x3f317218
GLOBL exp2c1<>(SB), RODATA|NOPTR, $4
DATA exp2c2<>+0(SB)/4, $0x3e75fdf0
GLOBL exp2c2<>(SB), RODATA|NOPTR, $4
DATA exp2c3<>+0(SB)/4, $0x3d635847
GLOBL exp2c3<>(SB), RODATA|NOPTR, $4
DATA exp2c4<>+0(SB)/4, $0x3c1d955b
GLOBL exp2c4<>(SB), RODATA|NOPTR, $4
DATA exp2c5<>+0(SB)/4, $0x3aaec3ff
GLOBL exp2c5<>(SB), RODATA|NOPTR, $4
DATA exp2c6<>+0(SB)/4, $0x39218489
GLOBL exp2c6<>(SB), RODATA|NOPTR, $4
DATA exp2c7<>+0(SB)/4, $0x377fe5fe
GLOBL exp2c7<>(SB), RODATA|NOPTR, $4

// The rung indexes 0..31 as float32.
DATA rungK<>+0x00(SB)/8, $0x3f80000000000000
DATA rungK<>+0x08(SB)/8, $0x4040000040000000
DATA rungK<>+0x10(SB)/8, $0x40a0000040800000
DATA rungK<>+0x18(SB)/8, $0x40e0000040c00000
DATA rungK<>+0x20(SB)/8, $0x4110000041000000
DATA rungK<>+0x28(SB)/8, $0x4130000041200000
DATA rungK<>+0x30(SB)/8, $0x4150000041400000
DATA rungK<>+0x38(SB)/8, $0x4170000041600000
DATA rungK<>+0x40(SB)/8, $0x4188000041800000
DATA rungK<>+0x48(SB)/8, $0x4198000041900000
DATA rungK<>+0x50(SB)/8, $0x41a8000041a00000
DATA rungK<>+0x58(SB)/8, $0x41b8000041b00000
DATA rungK<>+0x60(SB)/8, $0x41c8000041c00000
DATA rungK<>+0x68(SB)/8, $0x41d8000041d00000
DATA rungK<>+0x70(SB)/8, $0x41e8000041e00000
DATA rungK<>+0x78(SB)/8, $0x41f8000041f00000
GLOBL rungK<>(SB), RODATA|NOPTR, $128

// EXP2 replaces e by 2^e (within 2 ulp; 0 or +Inf out of range) using n.
#define EXP2(e, n, p) \
	VRNDSCALEPS      $0, e, n; \
	VSUBPS           n, e, e; \
	VBROADCASTSS     exp2c7<>(SB), p; \
	VFMADD213PS.BCST exp2c6<>(SB), e, p; \
	VFMADD213PS.BCST exp2c5<>(SB), e, p; \
	VFMADD213PS.BCST exp2c4<>(SB), e, p; \
	VFMADD213PS.BCST exp2c3<>(SB), e, p; \
	VFMADD213PS.BCST exp2c2<>(SB), e, p; \
	VFMADD213PS.BCST exp2c1<>(SB), e, p; \
	VFMADD213PS.BCST exp2c0<>(SB), e, p; \
	VSCALEFPS        n, p, e

// LADDER writes the 32 rungs exp2(a + k·b) (k·b rounded before the add,
// as the format specifies) of a q4tp row to dst, from the row's f16 ladder
// parameters a, b at ab. Clobbers AX and Z10..Z15.
#define LADDER(ab, dst) \
	MOVWLZX      (ab), AX; \
	VMOVD        AX, X10; \
	VCVTPH2PS    X10, X10; \
	VBROADCASTSS X10, Z10; \
	MOVWLZX      2(ab), AX; \
	VMOVD        AX, X11; \
	VCVTPH2PS    X11, X11; \
	VBROADCASTSS X11, Z11; \
	VMULPS       rungK<>(SB), Z11, Z12; \
	VMULPS       rungK<>+64(SB), Z11, Z13; \
	VADDPS       Z10, Z12, Z12; \
	VADDPS       Z10, Z13, Z13; \
	EXP2(Z12, Z14, Z15); \
	EXP2(Z13, Z10, Z11); \
	VMOVUPS      Z12, (dst); \
	VMOVUPS      Z13, 64(dst)

// LADDERS computes the ladders of the four rows of the q4row array at
// DX into their lad pointers (clobbers R12, R13).
#define LADDERS \
	MOVQ 16(DX), R12; MOVQ 24(DX), R13; LADDER(R13, R12); \
	MOVQ 48(DX), R12; MOVQ 56(DX), R13; LADDER(R13, R12); \
	MOVQ 80(DX), R12; MOVQ 88(DX), R13; LADDER(R13, R12); \
	MOVQ 112(DX), R12; MOVQ 120(DX), R13; LADDER(R13, R12)

// gfShr4 is the GF(2) affine matrix of x>>4 on bytes (VGF2P8AFFINEQB: bit
// i of the result is the parity of x AND byte 7-i of the matrix), the
// high nibble in one instruction instead of a shift and a mask.
DATA gfShr4<>+0(SB)/8, $0x1020408000000000
GLOBL gfShr4<>(SB), RODATA|NOPTR, $8

// Q4SCALES computes a row's scales for the next 16 groups into sc: the
// 80 code bits at the row's code pointer plus SI give 16 rung indexes,
// which pick rungs from the row's ladder (masked by K3 past the row's
// end) times the block scales Z22 (coff, loff: offsets of the row's code
// and ladder pointers in the q4row array at 0(SP)); the groups' biases Z23 (-8·Σq) times
// those scales go to acc.
#define Q4SCALES(coff, loff, sc, acc) \
	MOVQ            coff(SP), AX; \
	VBROADCASTI32X4 (AX)(SI*1), Z10; \
	VPSHUFB         Z28, Z10, Z10; \
	VPSRLVD         Z29, Z10, Z10; \
	MOVQ            loff(SP), AX; \
	VMOVUPS         (AX), Z30; \
	VPERMI2PS.Z     64(AX), Z30, K3, Z10; \
	VMULPS          Z22, Z10, sc; \
	VFMADD231PS     Z23, sc, acc

// Q4ROW is one row over a chunk of 4 groups: the 64 nibble bytes at nib
// (masked by K1) split into low (even weights) and high (odd weights, by
// a GF(2) affine shift) nibbles, dotted with the inputs Z4 (even) and Z5
// (odd) in int32, then converted and scaled by the chunk's lanes of the
// row's scales sc.
#define Q4ROW(nib, sc, idx, n, h, a, acc) \
	VMOVDQU8.Z          (nib), K1, n; \
	VGF2P8AFFINEQB.BCST $0, gfShr4<>(SB), n, h; \
	VPANDD              Z31, n, n; \
	VPXORD      a, a, a; \
	VPDPBUSD    Z4, n, a; \
	VPDPBUSD    Z5, h, a; \
	VPERMPS     sc, idx, h; \
	VCVTDQ2PS   a, a; \
	VFMADD231PS h, a, acc

// Q4CHUNK runs the four rows over one chunk, advances, leaves when no
// chunk remains and masks the nibbles of the last one by BX. DX walks
// the prefetches.
#define Q4CHUNK(idx) \
	PREFETCHT0 (DX); \
	PREFETCHT0 64(DX); \
	PREFETCHT0 128(DX); \
	PREFETCHT0 192(DX); \
	ADDQ     $256, DX; \
	VMOVDQU8 (DI), Z4; \
	VMOVDQU8 64(DI), Z5; \
	Q4ROW(R8, Z6, idx, Z10, Z11, Z12, Z0); \
	Q4ROW(R9, Z7, idx, Z13, Z14, Z15, Z1); \
	Q4ROW(R10, Z8, idx, Z16, Z17, Z18, Z2); \
	Q4ROW(R11, Z9, idx, Z19, Z20, Z21, Z3); \
	ADDQ    $64, R8; \
	ADDQ    $64, R9; \
	ADDQ    $64, R10; \
	ADDQ    $64, R11; \
	ADDQ    $128, DI; \
	DECQ    CX; \
	JZ      q4done; \
	MOVQ    $-1, AX; \
	CMPQ    CX, $1; \
	CMOVQEQ BX, AX; \
	KMOVQ   AX, K1

// func q4tpQuadsAVX512(job *q4job, gpr int, x *byte, d *float32, s *int32)
//
// For job.quads blocks of four q4tp rows (gpr groups) writes the rows'
// dots with an input in qNib layout to job.out. The frame holds the
// current block's q4row array (0(SP)), its ladders (128(SP)) and the block
// index (640(SP)).
TEXT ·q4tpQuadsAVX512(SB), NOSPLIT, $648-40
	// K5: the lanes (groups) of the last 16 that exist.
	MOVQ   gpr+8(FP), BX
	MOVQ   BX, CX
	ANDQ   $15, CX
	KXNORW K5, K5, K5
	JZ     q4m1
	MOVL   $1, AX
	SHLL   CX, AX
	DECL   AX
	KMOVW  AX, K5

q4m1:
	// BX: the nibble-byte mask of the last chunk of 4 groups.
	ANDQ $3, BX
	JNZ  q4m2
	MOVQ $4, BX
q4m2:
	SHLQ   $4, BX
	MOVQ   BX, CX
	MOVQ   $-1, BX
	CMPQ   CX, $64
	JEQ    q4m3
	MOVQ   $1, BX
	SHLQ   CX, BX
	DECQ   BX
q4m3:
	MOVL         $0x0f0f0f0f, AX
	VPBROADCASTD AX, Z31
	VMOVDQU32    codeBytes<>(SB), Z28
	VMOVDQU32    codeShift16<>(SB), Z29
	VMOVDQU32    chunkIdx0<>(SB), Z24
	VMOVDQU32    chunkIdx1<>(SB), Z25
	VMOVDQU32    chunkIdx2<>(SB), Z26
	VMOVDQU32    chunkIdx3<>(SB), Z27
	MOVQ         $0, 640(SP)

q4block:
	// The block's q4row array: rows 4k..4k+3 of the job.
	MOVQ  job+0(FP), DI
	MOVQ  640(SP), R9
	SHLQ  $2, R9
	MOVQ  24(DI), R10
	MOVQ  R9, AX
	IMULQ R10, AX
	ADDQ  0(DI), AX
	MOVQ  AX, 0(SP)
	ADDQ  R10, AX
	MOVQ  AX, 32(SP)
	ADDQ  R10, AX
	MOVQ  AX, 64(SP)
	ADDQ  R10, AX
	MOVQ  AX, 96(SP)
	MOVQ  32(DI), R10
	MOVQ  R9, AX
	IMULQ R10, AX
	ADDQ  8(DI), AX
	MOVQ  AX, 8(SP)
	ADDQ  R10, AX
	MOVQ  AX, 40(SP)
	ADDQ  R10, AX
	MOVQ  AX, 72(SP)
	ADDQ  R10, AX
	MOVQ  AX, 104(SP)
	LEAQ  128(SP), AX
	MOVQ  AX, 16(SP)
	LEAQ  256(SP), AX
	MOVQ  AX, 48(SP)
	LEAQ  384(SP), AX
	MOVQ  AX, 80(SP)
	LEAQ  512(SP), AX
	MOVQ  AX, 112(SP)
	MOVQ  16(DI), AX
	LEAQ  (AX)(R9*4), AX
	MOVQ  AX, 24(SP)
	ADDQ  $4, AX
	MOVQ  AX, 56(SP)
	ADDQ  $4, AX
	MOVQ  AX, 88(SP)
	ADDQ  $4, AX
	MOVQ  AX, 120(SP)

	LEAQ 0(SP), DX
	LADDERS
	MOVQ 0(SP), R8
	MOVQ 32(SP), R9
	MOVQ 64(SP), R10
	MOVQ 96(SP), R11
	MOVQ gpr+8(FP), CX
	MOVQ CX, AX
	SHLQ $4, AX
	LEAQ PFAHEAD(R11)(AX*1), DX
	MOVQ x+16(FP), DI
	MOVQ d+24(FP), R12
	MOVQ s+32(FP), R13
	ADDQ $3, CX
	SHRQ $2, CX // chunks

	MOVQ    $-1, AX
	CMPQ    CX, $1
	CMOVQEQ BX, AX
	KMOVQ   AX, K1
	KXNORW  K3, K3, K3
	VPXORD  Z0, Z0, Z0
	VPXORD  Z1, Z1, Z1
	VPXORD  Z2, Z2, Z2
	VPXORD  Z3, Z3, Z3
	XORQ    SI, SI // code byte offset of the 16 groups: 10 per 16

q4super:
	CMPQ  CX, $4
	JGT   q4s1
	KMOVW K5, K3
q4s1:
	VMOVUPS   (R12), Z22
	VCVTDQ2PS (R13), Z23
	Q4SCALES(8, 16, Z6, Z0)
	Q4SCALES(40, 48, Z7, Z1)
	Q4SCALES(72, 80, Z8, Z2)
	Q4SCALES(104, 112, Z9, Z3)
	Q4CHUNK(Z24)
	Q4CHUNK(Z25)
	Q4CHUNK(Z26)
	Q4CHUNK(Z27)
	ADDQ $10, SI
	ADDQ $64, R12
	ADDQ $64, R13
	JMP  q4super

q4done:
	HSUM4
	MOVQ    job+0(FP), AX
	MOVQ    48(AX), DI
	MOVQ    640(SP), R9
	SHLQ    $4, R9
	VMOVUPS X0, (DI)(R9*1)
	INCQ    640(SP)
	MOVQ    640(SP), R9
	CMPQ    R9, 40(AX)
	JLT     q4block
	VZEROUPPER
	RET

// func quantizeAVX512(x *float32, n int, q *byte, d *float32, s *int32, shift int, nib bool)
//
// Quantizes x[:n] block by block exactly as quantizeRowGo (the same float32
// operations, round to nearest even); writes only the blocks themselves.
TEXT ·quantizeAVX512(SB), NOSPLIT, $0-49
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), R8
	MOVQ q+16(FP), DI
	MOVQ d+24(FP), R9
	MOVQ s+32(FP), R10
	MOVQ shift+40(FP), CX
	MOVBQZX nib+48(FP), R11

	MOVL         $0x7fffffff, AX
	VPBROADCASTD AX, Z31
	MOVL         $0x42fe0000, AX // 127.0
	VMOVD        AX, X30
	MOVL         $0x03800000, AX // 0x1p-120
	VMOVD        AX, X29
	VMOVDQU32    idxEven<>(SB), Z28
	VMOVDQU32    idxOdd<>(SB), Z27
	XORQ         BX, BX // block index

qloop:
	CMPQ R8, $0
	JLE  qdone
	// Masks for up to 32 remaining values: K1 the first 16, K2 the rest.
	CMPQ   R8, $32
	JLT    qpartial
	KXNORW K1, K1, K1
	KXNORW K2, K2, K2
	JMP    qload

qpartial:
	MOVQ  R8, DX
	CMPQ  DX, $16
	JLE   qp1
	MOVQ  $16, DX
qp1:
	MOVQ  CX, R12
	MOVQ  DX, CX
	MOVL  $1, AX
	SHLL  CX, AX
	DECL  AX
	KMOVW AX, K1
	MOVQ  R8, CX
	SUBQ  $16, CX
	MOVL  $0, AX
	JLE   qp2
	MOVL  $1, AX
	SHLL  CX, AX
	DECL  AX
qp2:
	KMOVW AX, K2
	MOVQ  R12, CX

qload:
	VMOVUPS.Z (SI), K1, Z0
	VMOVUPS.Z 64(SI), K2, Z1
	// absmax as the int32 max of the bits of |x|: the float order for
	// non-negative values, and a NaN (above +Inf) wins as in Go's max
	// (VMAXPS would drop a NaN of its first operand); VUCOMISS below
	// then sends a NaN block to qzero.
	VANDPS    Z31, Z0, Z2
	VANDPS    Z31, Z1, Z3
	VPMAXSD   Z3, Z2, Z2
	VEXTRACTF32X8 $1, Z2, Y3
	VPMAXSD   Y3, Y2, Y2
	VEXTRACTF128 $1, Y2, X3
	VPMAXSD   X3, X2, X2
	VPERMILPS $0x4e, X2, X3
	VPMAXSD   X3, X2, X2
	VPERMILPS $0xb1, X2, X3
	VPMAXSD   X3, X2, X2

	// Output addresses: plain blocks at 32·b; q4tp chunks at 128·(b/4),
	// even values at +16·(b%4), odd ones 64 bytes further.
	MOVQ BX, R13
	SHLQ $5, R13
	TESTQ R11, R11
	JZ   qaddr
	MOVQ BX, R13
	SHRQ $2, R13
	SHLQ $7, R13
	MOVQ BX, AX
	ANDQ $3, AX
	SHLQ $4, AX
	ADDQ AX, R13

qaddr:
	VUCOMISS X29, X2
	JCS      qzero

	VDIVSS       X30, X2, X4 // d = absmax/127
	VDIVSS       X2, X30, X5 // 127/absmax
	VBROADCASTSS X5, Z5
	VMULPS       Z5, Z0, Z0
	VMULPS       Z5, Z1, Z1
	VCVTPS2DQ    Z0, Z0
	VCVTPS2DQ    Z1, Z1
	VPADDD       Z1, Z0, Z6
	VEXTRACTI32X8 $1, Z6, Y7
	VPADDD       Y7, Y6, Y6
	VEXTRACTI128 $1, Y6, X7
	VPADDD       X7, X6, X6
	VPSHUFD      $0x4e, X6, X7
	VPADDD       X7, X6, X6
	VPSHUFD      $0xb1, X6, X7
	VPADDD       X7, X6, X6
	VMOVD        X6, AX
	SHLL         CX, AX
	NEGL         AX
	MOVL         AX, (R10)(BX*4)
	VMOVSS       X4, (R9)(BX*4)
	TESTQ        R11, R11
	JNZ          qnib
	// int8(q) is q's low byte: truncate (a NaN product of an infinite
	// block's infinities is 0x80000000, which Go stores as 0).
	VPMOVDB      Z0, X8
	VPMOVDB      Z1, X9
	VMOVDQU      X8, (DI)(R13*1)
	VMOVDQU      X9, 16(DI)(R13*1)
	JMP          qnext

qnib:
	VMOVDQA64 Z28, Z8
	VPERMI2D  Z1, Z0, Z8
	VMOVDQA64 Z27, Z9
	VPERMI2D  Z1, Z0, Z9
	VPMOVDB   Z8, X8
	VPMOVDB   Z9, X9
	VMOVDQU   X8, (DI)(R13*1)
	VMOVDQU   X9, 64(DI)(R13*1)
	JMP       qnext

qzero:
	MOVL    $0, (R10)(BX*4)
	MOVL    $0, (R9)(BX*4)
	VPXORD  X8, X8, X8
	TESTQ   R11, R11
	JNZ     qzeronib
	VMOVDQU X8, (DI)(R13*1)
	VMOVDQU X8, 16(DI)(R13*1)
	JMP     qnext

qzeronib:
	VMOVDQU X8, (DI)(R13*1)
	VMOVDQU X8, 64(DI)(R13*1)

qnext:
	ADDQ $128, SI
	SUBQ $32, R8
	INCQ BX
	JMP  qloop

qdone:
	VZEROUPPER
	RET

// func streamAVX512(p *byte, n int) uint64
//
// Reads n bytes (a multiple of 256) with 64-byte loads and returns a
// checksum: the machine's read bandwidth for BenchmarkStream.
TEXT ·streamAVX512(SB), NOSPLIT, $0-24
	MOVQ   p+0(FP), SI
	MOVQ   n+8(FP), CX
	SHRQ   $8, CX
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	VPXORQ Z2, Z2, Z2
	VPXORQ Z3, Z3, Z3
	TESTQ  CX, CX
	JZ     sdone

sloop:
	VPXORQ (SI), Z0, Z0
	VPXORQ 64(SI), Z1, Z1
	VPXORQ 128(SI), Z2, Z2
	VPXORQ 192(SI), Z3, Z3
	ADDQ   $256, SI
	DECQ   CX
	JNZ    sloop

sdone:
	VPXORQ Z1, Z0, Z0
	VPXORQ Z3, Z2, Z2
	VPXORQ Z2, Z0, Z0
	VEXTRACTI64X4 $1, Z0, Y1
	VPXORQ Y1, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPXORQ X1, X0, X0
	VMOVQ  X0, AX
	VPEXTRQ $1, X0, BX
	XORQ   BX, AX
	MOVQ   AX, ret+16(FP)
	VZEROUPPER
	RET

// Prefill (several positions per weight block) for q4tp: the block of four
// rows is unpacked once into a scratch buffer that stays in L1, then every
// position runs over it with only the integer dots and the scaling left.
//
// Scratch layout for gpr groups, C = ⌈gpr/4⌉ chunks, S = ⌈gpr/16⌉:
//   C × 512 bytes: per chunk, for rows 0..3, 64 low nibbles then 64 high
//   nibbles (bytes 0..15, zero past the row's end);
//   S × 256 bytes: per 16 groups, for rows 0..3, the 16 rungs the groups'
//   codes pick (zero past the row's end).

// Q4UNPACK stores one row's chunk of nibbles (masked by K1), the low ones
// at off(DI), the high ones at off2(DI).
#define Q4UNPACK(nib, off, off2, n, h) \
	VMOVDQU8.Z (nib), K1, n; \
	VPSRLW     $4, n, h; \
	VPANDD     Z31, n, n; \
	VPANDD     Z31, h, h; \
	VMOVDQU8   n, off(DI); \
	VMOVDQU8   h, off2(DI)

// Q4RUNGS stores a row's 16 rungs (masked by K3) at off(DI); DX points
// at the q4row array.
#define Q4RUNGS(coff, loff, off) \
	MOVQ            coff(DX), AX; \
	VBROADCASTI32X4 (AX)(SI*1), Z10; \
	VPSHUFB         Z28, Z10, Z10; \
	VPSRLVD         Z29, Z10, Z10; \
	MOVQ            loff(DX), AX; \
	VMOVUPS         (AX), Z30; \
	VPERMI2PS.Z     64(AX), Z30, K3, Z10; \
	VMOVUPS         Z10, off(DI)

// func q4tpUnpack4AVX512(rows *[4]q4row, gpr int, dst *byte)
TEXT ·q4tpUnpack4AVX512(SB), NOSPLIT, $0-24
	MOVQ rows+0(FP), DX
	LADDERS
	MOVQ 0(DX), R8
	MOVQ 32(DX), R9
	MOVQ 64(DX), R10
	MOVQ 96(DX), R11
	MOVQ gpr+8(FP), BX
	MOVQ dst+16(FP), DI

	// K5: lanes of the last 16 groups that exist; CX: chunks; BX: the
	// nibble-byte mask of the last chunk (as in q4tpDot4AVX512).
	MOVQ   BX, CX
	ANDQ   $15, CX
	KXNORW K5, K5, K5
	JZ     u4m1
	MOVL   $1, AX
	SHLL   CX, AX
	DECL   AX
	KMOVW  AX, K5
u4m1:
	MOVQ BX, R12 // gpr
	LEAQ 3(BX), CX
	SHRQ $2, CX
	ANDQ $3, BX
	JNZ  u4m2
	MOVQ $4, BX
u4m2:
	SHLQ   $4, BX
	MOVQ   BX, AX
	MOVQ   $-1, BX
	CMPQ   AX, $64
	JEQ    u4m3
	MOVQ   CX, SI
	MOVQ   AX, CX
	MOVQ   $1, BX
	SHLQ   CX, BX
	DECQ   BX
	MOVQ   SI, CX
u4m3:
	MOVL         $0x0f0f0f0f, AX
	VPBROADCASTD AX, Z31
	VMOVDQU32    codeBytes<>(SB), Z28
	VMOVDQU32    codeShift16<>(SB), Z29

u4chunk:
	MOVQ    $-1, AX
	CMPQ    CX, $1
	CMOVQEQ BX, AX
	KMOVQ   AX, K1
	Q4UNPACK(R8, 0, 64, Z0, Z1)
	Q4UNPACK(R9, 128, 192, Z2, Z3)
	Q4UNPACK(R10, 256, 320, Z4, Z5)
	Q4UNPACK(R11, 384, 448, Z6, Z7)
	ADDQ $64, R8
	ADDQ $64, R9
	ADDQ $64, R10
	ADDQ $64, R11
	ADDQ $512, DI
	DECQ CX
	JNZ  u4chunk

	// Rungs, 16 groups at a time; R12 counts the groups left.
	XORQ   SI, SI
	KXNORW K3, K3, K3
u4super:
	CMPQ  R12, $16
	JGE   u4s1
	KMOVW K5, K3
u4s1:
	Q4RUNGS(8, 16, 0)
	Q4RUNGS(40, 48, 64)
	Q4RUNGS(72, 80, 128)
	Q4RUNGS(104, 112, 192)
	ADDQ $10, SI
	ADDQ $256, DI
	SUBQ $16, R12
	JGT  u4super

	VZEROUPPER
	RET

// Q4MMROW is one row of a chunk from the scratch at off(R8), off2(R8).
#define Q4MMROW(off, off2, sc, idx, n, h, a, acc) \
	VMOVDQU8    off(R8), n; \
	VMOVDQU8    off2(R8), h; \
	VPXORD      a, a, a; \
	VPDPBUSD    Z4, n, a; \
	VPDPBUSD    Z5, h, a; \
	VPERMPS     sc, idx, h; \
	VCVTDQ2PS   a, a; \
	VFMADD231PS h, a, acc

#define Q4MMCHUNK(idx) \
	VMOVDQU8 (DI), Z4; \
	VMOVDQU8 64(DI), Z5; \
	Q4MMROW(0, 64, Z6, idx, Z10, Z11, Z12, Z0); \
	Q4MMROW(128, 192, Z7, idx, Z13, Z14, Z15, Z1); \
	Q4MMROW(256, 320, Z8, idx, Z16, Z17, Z18, Z2); \
	Q4MMROW(384, 448, Z9, idx, Z19, Z20, Z21, Z3); \
	ADDQ $512, R8; \
	ADDQ $128, DI; \
	DECQ CX; \
	JZ   mmpos

// func q4tpMM4AVX512(w *byte, gpr int, x *byte, xstride int, d *float32, s *int32, bstride, npos int, out *float32, ostride int)
//
// For each of npos positions (inputs at x + j·xstride, scales and biases
// at d, s + j·bstride bytes) writes the four rows' dots from the scratch w
// to out + j·ostride bytes.
TEXT ·q4tpMM4AVX512(SB), NOSPLIT, $0-80
	MOVQ x+16(FP), SI
	MOVQ d+32(FP), BX
	MOVQ s+40(FP), DX
	MOVQ npos+56(FP), R10
	MOVQ out+64(FP), R11
	MOVQ gpr+8(FP), R9
	ADDQ $3, R9
	SHRQ $2, R9 // chunks

	VMOVDQU32 chunkIdx0<>(SB), Z24
	VMOVDQU32 chunkIdx1<>(SB), Z25
	VMOVDQU32 chunkIdx2<>(SB), Z26
	VMOVDQU32 chunkIdx3<>(SB), Z27

mmloop:
	TESTQ  R10, R10
	JZ     mmdone
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	MOVQ   w+0(FP), R8
	MOVQ   R9, AX
	SHLQ   $9, AX
	ADDQ   R8, AX // the rungs
	MOVQ   SI, DI
	MOVQ   BX, R12
	MOVQ   DX, R13
	MOVQ   R9, CX

mmsuper:
	VMOVUPS     (R12), Z22
	VCVTDQ2PS   (R13), Z23
	VMULPS      (AX), Z22, Z6
	VMULPS      64(AX), Z22, Z7
	VMULPS      128(AX), Z22, Z8
	VMULPS      192(AX), Z22, Z9
	VFMADD231PS Z23, Z6, Z0
	VFMADD231PS Z23, Z7, Z1
	VFMADD231PS Z23, Z8, Z2
	VFMADD231PS Z23, Z9, Z3
	Q4MMCHUNK(Z24)
	Q4MMCHUNK(Z25)
	Q4MMCHUNK(Z26)
	Q4MMCHUNK(Z27)
	ADDQ $256, AX
	ADDQ $64, R12
	ADDQ $64, R13
	JMP  mmsuper

mmpos:
	HSUM4
	VMOVUPS X0, (R11)
	ADDQ    ostride+72(FP), R11
	ADDQ    xstride+24(FP), SI
	ADDQ    bstride+48(FP), BX
	ADDQ    bstride+48(FP), DX
	DECQ    R10
	JMP     mmloop

mmdone:
	VZEROUPPER
	RET

// Float formats: four rows of f32, f16 or bf16 weights times a float32
// input, 32 columns per step into two accumulators per row (Z0..Z3 and
// Z8..Z11), the last 0..31 columns 16 at a time through masked loads.

#define FROW_F32(addr, t, xr, acc) VFMADD231PS addr, xr, acc
#define FROW_F16(addr, t, xr, acc) VCVTPH2PS addr, t; VFMADD231PS t, xr, acc
#define FROW_BF16(addr, t, xr, acc) VPMOVZXWD addr, t; VPSLLD $16, t, t; VFMADD231PS t, xr, acc

// Masked loads of 16 columns (K1) converted to float32.
#define FTAIL_F32(addr, t) VMOVUPS.Z addr, K1, t
#define FTAIL_F16(addr, t) VMOVDQU16.Z addr, K1, Y6; VCVTPH2PS Y6, t
#define FTAIL_BF16(addr, t) VMOVDQU16.Z addr, K1, Y6; VPMOVZXWD Y6, t; VPSLLD $16, t, t

// func f32Dot4AVX512(w *float32, stride, n int, x *float32, out *[4]float32)
//
// stride and the pointers are in bytes between rows (0: one row four times).
TEXT ·f32Dot4AVX512(SB), NOSPLIT, $0-40
	MOVQ   w+0(FP), AX
	MOVQ   stride+8(FP), BX
	MOVQ   n+16(FP), CX
	MOVQ   x+24(FP), SI
	LEAQ   (AX)(BX*2), DX
	ADDQ   BX, DX
	LEAQ   PFAHEAD(DX)(BX*1), R11
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	MOVQ   CX, R10
	SHRQ   $5, R10
	JZ     f32tail

f32loop:
	PREFETCHT0 0(R11)
	PREFETCHT0 64(R11)
	PREFETCHT0 128(R11)
	PREFETCHT0 192(R11)
	PREFETCHT0 256(R11)
	PREFETCHT0 320(R11)
	PREFETCHT0 384(R11)
	PREFETCHT0 448(R11)
	ADDQ       $512, R11
	VMOVUPS (SI), Z4
	VMOVUPS 64(SI), Z5
	FROW_F32((AX), Z12, Z4, Z0)
	FROW_F32((AX)(BX*1), Z13, Z4, Z1)
	FROW_F32((AX)(BX*2), Z14, Z4, Z2)
	FROW_F32((DX), Z15, Z4, Z3)
	FROW_F32(64(AX), Z16, Z5, Z8)
	FROW_F32(64(AX)(BX*1), Z17, Z5, Z9)
	FROW_F32(64(AX)(BX*2), Z18, Z5, Z10)
	FROW_F32(64(DX), Z19, Z5, Z11)
	ADDQ $128, AX
	ADDQ $128, DX
	ADDQ $128, SI
	DECQ R10
	JNZ  f32loop

f32tail:
	ANDQ $31, CX
	JZ   f32done

f32tail16:
	MOVQ $-1, R9
	CMPQ CX, $16
	JGE  f32mask
	MOVQ $1, R9
	SHLQ CX, R9
	DECQ R9

f32mask:
	KMOVW       R9, K1
	VMOVUPS.Z   (SI), K1, Z4
	FTAIL_F32((AX), Z12)
	VFMADD231PS Z12, Z4, Z0
	FTAIL_F32((AX)(BX*1), Z13)
	VFMADD231PS Z13, Z4, Z1
	FTAIL_F32((AX)(BX*2), Z14)
	VFMADD231PS Z14, Z4, Z2
	FTAIL_F32((DX), Z15)
	VFMADD231PS Z15, Z4, Z3
	ADDQ        $64, AX
	ADDQ        $64, DX
	ADDQ        $64, SI
	SUBQ        $16, CX
	JGT         f32tail16

f32done:
	VADDPS  Z8, Z0, Z0
	VADDPS  Z9, Z1, Z1
	VADDPS  Z10, Z2, Z2
	VADDPS  Z11, Z3, Z3
	HSUM4
	MOVQ    out+32(FP), AX
	VMOVUPS X0, (AX)
	VZEROUPPER
	RET

// func f16Dot4AVX512(w *uint16, stride, n int, x *float32, out *[4]float32)
//
// stride and the pointers are in bytes between rows (0: one row four times).
TEXT ·f16Dot4AVX512(SB), NOSPLIT, $0-40
	MOVQ   w+0(FP), AX
	MOVQ   stride+8(FP), BX
	MOVQ   n+16(FP), CX
	MOVQ   x+24(FP), SI
	LEAQ   (AX)(BX*2), DX
	ADDQ   BX, DX
	LEAQ   PFAHEAD(DX)(BX*1), R11
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	MOVQ   CX, R10
	SHRQ   $5, R10
	JZ     f16tail

f16loop:
	PREFETCHT0 0(R11)
	PREFETCHT0 64(R11)
	PREFETCHT0 128(R11)
	PREFETCHT0 192(R11)
	ADDQ       $256, R11
	VMOVUPS (SI), Z4
	VMOVUPS 64(SI), Z5
	FROW_F16((AX), Z12, Z4, Z0)
	FROW_F16((AX)(BX*1), Z13, Z4, Z1)
	FROW_F16((AX)(BX*2), Z14, Z4, Z2)
	FROW_F16((DX), Z15, Z4, Z3)
	FROW_F16(32(AX), Z16, Z5, Z8)
	FROW_F16(32(AX)(BX*1), Z17, Z5, Z9)
	FROW_F16(32(AX)(BX*2), Z18, Z5, Z10)
	FROW_F16(32(DX), Z19, Z5, Z11)
	ADDQ $64, AX
	ADDQ $64, DX
	ADDQ $128, SI
	DECQ R10
	JNZ  f16loop

f16tail:
	ANDQ $31, CX
	JZ   f16done

f16tail16:
	MOVQ $-1, R9
	CMPQ CX, $16
	JGE  f16mask
	MOVQ $1, R9
	SHLQ CX, R9
	DECQ R9

f16mask:
	KMOVW       R9, K1
	VMOVUPS.Z   (SI), K1, Z4
	FTAIL_F16((AX), Z12)
	VFMADD231PS Z12, Z4, Z0
	FTAIL_F16((AX)(BX*1), Z13)
	VFMADD231PS Z13, Z4, Z1
	FTAIL_F16((AX)(BX*2), Z14)
	VFMADD231PS Z14, Z4, Z2
	FTAIL_F16((DX), Z15)
	VFMADD231PS Z15, Z4, Z3
	ADDQ        $32, AX
	ADDQ        $32, DX
	ADDQ        $64, SI
	SUBQ        $16, CX
	JGT         f16tail16

f16done:
	VADDPS  Z8, Z0, Z0
	VADDPS  Z9, Z1, Z1
	VADDPS  Z10, Z2, Z2
	VADDPS  Z11, Z3, Z3
	HSUM4
	MOVQ    out+32(FP), AX
	VMOVUPS X0, (AX)
	VZEROUPPER
	RET

// func bf16Dot4AVX512(w *uint16, stride, n int, x *float32, out *[4]float32)
//
// stride and the pointers are in bytes between rows (0: one row four times).
TEXT ·bf16Dot4AVX512(SB), NOSPLIT, $0-40
	MOVQ   w+0(FP), AX
	MOVQ   stride+8(FP), BX
	MOVQ   n+16(FP), CX
	MOVQ   x+24(FP), SI
	LEAQ   (AX)(BX*2), DX
	ADDQ   BX, DX
	LEAQ   PFAHEAD(DX)(BX*1), R11
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	MOVQ   CX, R10
	SHRQ   $5, R10
	JZ     bf16tail

bf16loop:
	PREFETCHT0 0(R11)
	PREFETCHT0 64(R11)
	PREFETCHT0 128(R11)
	PREFETCHT0 192(R11)
	ADDQ       $256, R11
	VMOVUPS (SI), Z4
	VMOVUPS 64(SI), Z5
	FROW_BF16((AX), Z12, Z4, Z0)
	FROW_BF16((AX)(BX*1), Z13, Z4, Z1)
	FROW_BF16((AX)(BX*2), Z14, Z4, Z2)
	FROW_BF16((DX), Z15, Z4, Z3)
	FROW_BF16(32(AX), Z16, Z5, Z8)
	FROW_BF16(32(AX)(BX*1), Z17, Z5, Z9)
	FROW_BF16(32(AX)(BX*2), Z18, Z5, Z10)
	FROW_BF16(32(DX), Z19, Z5, Z11)
	ADDQ $64, AX
	ADDQ $64, DX
	ADDQ $128, SI
	DECQ R10
	JNZ  bf16loop

bf16tail:
	ANDQ $31, CX
	JZ   bf16done

bf16tail16:
	MOVQ $-1, R9
	CMPQ CX, $16
	JGE  bf16mask
	MOVQ $1, R9
	SHLQ CX, R9
	DECQ R9

bf16mask:
	KMOVW       R9, K1
	VMOVUPS.Z   (SI), K1, Z4
	FTAIL_BF16((AX), Z12)
	VFMADD231PS Z12, Z4, Z0
	FTAIL_BF16((AX)(BX*1), Z13)
	VFMADD231PS Z13, Z4, Z1
	FTAIL_BF16((AX)(BX*2), Z14)
	VFMADD231PS Z14, Z4, Z2
	FTAIL_BF16((DX), Z15)
	VFMADD231PS Z15, Z4, Z3
	ADDQ        $32, AX
	ADDQ        $32, DX
	ADDQ        $64, SI
	SUBQ        $16, CX
	JGT         bf16tail16

bf16done:
	VADDPS  Z8, Z0, Z0
	VADDPS  Z9, Z1, Z1
	VADDPS  Z10, Z2, Z2
	VADDPS  Z11, Z3, Z3
	HSUM4
	MOVQ    out+32(FP), AX
	VMOVUPS X0, (AX)
	VZEROUPPER
	RET

// func prefetchL2(p *byte, n int)
//
// Prefetches the n bytes at p into L2, one instruction per 64 bytes.
TEXT ·prefetchL2(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	ADDQ $63, CX
	SHRQ $6, CX
	JZ   pdone

ploop:
	PREFETCHT1 (SI)
	ADDQ       $64, SI
	DECQ       CX
	JNZ        ploop

pdone:
	RET

// Prefill for q8_row/q8_2f: a block of four rows is copied once into an L1
// scratch with each weight's top bit flipped (w+128 as unsigned), 64
// columns of the four rows after each other; every position then runs
// over it. Same arithmetic as q8Dot4AVX512.

// func q8Unpack4AVX512(w *byte, stride, n int, dst *byte)
TEXT ·q8Unpack4AVX512(SB), NOSPLIT, $0-32
	MOVQ w+0(FP), AX
	MOVQ stride+8(FP), BX
	MOVQ n+16(FP), CX
	MOVQ dst+24(FP), DI
	LEAQ (AX)(BX*2), DX
	ADDQ BX, DX
	MOVL         $0x80808080, R9
	VPBROADCASTD R9, Z31

u8loop:
	TESTQ CX, CX
	JLE   u8done
	MOVQ  $-1, R9
	CMPQ  CX, $64
	JGE   u8full
	MOVQ  $1, R9
	SHLQ  CX, R9
	DECQ  R9
u8full:
	KMOVQ      R9, K1
	VMOVDQU8.Z (AX), K1, Z0
	VMOVDQU8.Z (AX)(BX*1), K1, Z1
	VMOVDQU8.Z (AX)(BX*2), K1, Z2
	VMOVDQU8.Z (DX), K1, Z3
	VPXORD     Z31, Z0, Z0
	VPXORD     Z31, Z1, Z1
	VPXORD     Z31, Z2, Z2
	VPXORD     Z31, Z3, Z3
	VMOVDQU8   Z0, (DI)
	VMOVDQU8   Z1, 64(DI)
	VMOVDQU8   Z2, 128(DI)
	VMOVDQU8   Z3, 192(DI)
	ADDQ       $64, AX
	ADDQ       $64, DX
	ADDQ       $256, DI
	SUBQ       $64, CX
	JMP        u8loop

u8done:
	VZEROUPPER
	RET

// Q8MMROW is one row of q8MM4AVX512 over a chunk of the scratch.
#define Q8MMROW(off, t, a, acc) \
	VMOVDQU8    off(R8), t; \
	VMOVDQA64   Z6, a; \
	VPDPBUSD    Z4, t, a; \
	VCVTDQ2PS   a, a; \
	VFMADD231PS Z5, a, acc

// func q8MM4AVX512(w *byte, chunks int, x *byte, xstride int, d *float32, s *int32, bstride, npos int, out *float32, ostride int, scale *[4]float32)
//
// For each of npos positions (inputs at x + j·xstride, scales and biases
// at d, s + j·bstride bytes) writes the four rows' dots (times scale) from
// the scratch w of chunks 64-column chunks to out + j·ostride bytes.
TEXT ·q8MM4AVX512(SB), NOSPLIT, $0-88
	MOVQ      x+16(FP), SI
	MOVQ      d+32(FP), BX
	MOVQ      s+40(FP), DX
	MOVQ      npos+56(FP), R10
	MOVQ      out+64(FP), R11
	MOVQ      scale+80(FP), AX
	VMOVUPS   (AX), X28
	VMOVDQU32 idx2x8<>(SB), Z30
	MOVL      $0x0101, R9
	KMOVW     R9, K2

m8loop:
	TESTQ  R10, R10
	JZ     m8done
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	MOVQ   w+0(FP), R8
	MOVQ   SI, DI
	MOVQ   BX, R12
	MOVQ   DX, R13
	MOVQ   chunks+8(FP), CX

m8chunk:
	VMOVDQU8 (DI), Z4
	VMOVQ    (R12), X5
	VPERMD   Z5, Z30, Z5
	VMOVQ    (R13), X6
	VPERMD.Z Z6, Z30, K2, Z6
	Q8MMROW(0, Z7, Z8, Z0)
	Q8MMROW(64, Z9, Z10, Z1)
	Q8MMROW(128, Z11, Z12, Z2)
	Q8MMROW(192, Z13, Z14, Z3)
	ADDQ     $256, R8
	ADDQ     $64, DI
	ADDQ     $8, R12
	ADDQ     $8, R13
	DECQ     CX
	JNZ      m8chunk

	HSUM4
	VMULPS  X28, X0, X0
	VMOVUPS X0, (R11)
	ADDQ    ostride+72(FP), R11
	ADDQ    xstride+24(FP), SI
	ADDQ    bstride+48(FP), BX
	ADDQ    bstride+48(FP), DX
	DECQ    R10
	JMP     m8loop

m8done:
	VZEROUPPER
	RET

// Transposed q4tp blocks for small batches (q4tpUnpack4TAVX512,
// q4tpXposeAVX512 and q4tpMM4TXAVX512, rows of a multiple of 16 groups). The 256 nibble bytes
// of a row's 16 groups, read as four registers R0..R3 of 4 groups (one per
// 128-bit lane k, 4 dwords i each), are transposed in each 128-bit lane
// (Q_i lane k dword c = R_c lane k dword i), so that every dword lane
// 4k+c of the 8 registers (Q_i's low and high nibbles) holds 4 weights of
// group 4c+k: one int32 lane per group collects the group's whole dot in
// 8 VPDPBUSDs and is converted and scaled once, instead of once per 2.
// The inputs (qNib chunks, whose 64-byte halves are laid out as the
// nibble bytes) take the same transpose, and the per-group scales and
// biases the lane permutation lanesT.

// lanesT[L] = 4·(L mod 4) + L/4: the group held by dword lane L.
DATA lanesT<>+0x00(SB)/8, $0x0000000400000000
DATA lanesT<>+0x08(SB)/8, $0x0000000c00000008
DATA lanesT<>+0x10(SB)/8, $0x0000000500000001
DATA lanesT<>+0x18(SB)/8, $0x0000000d00000009
DATA lanesT<>+0x20(SB)/8, $0x0000000600000002
DATA lanesT<>+0x28(SB)/8, $0x0000000e0000000a
DATA lanesT<>+0x30(SB)/8, $0x0000000700000003
DATA lanesT<>+0x38(SB)/8, $0x0000000f0000000b
GLOBL lanesT<>(SB), RODATA|NOPTR, $64

// XPOSE4 transposes the dwords of a, b, c, d in each 128-bit lane (a, b,
// c, d become Q0..Q3; t0..t3 clobbered).
#define XPOSE4(a, b, c, d, t0, t1, t2, t3) \
	VPUNPCKLDQ  b, a, t0; \
	VPUNPCKHDQ  b, a, t1; \
	VPUNPCKLDQ  d, c, t2; \
	VPUNPCKHDQ  d, c, t3; \
	VPUNPCKLQDQ t2, t0, a; \
	VPUNPCKHQDQ t2, t0, b; \
	VPUNPCKLQDQ t3, t1, c; \
	VPUNPCKHQDQ t3, t1, d

// Q4TSPLIT stores the low nibbles of q at lo(DI), the high ones at hi(DI).
#define Q4TSPLIT(q, lo, hi) \
	VGF2P8AFFINEQB.BCST $0, gfShr4<>(SB), q, Z8; \
	VPANDD              Z31, q, q; \
	VMOVDQU64           q, lo(DI); \
	VMOVDQU64           Z8, hi(DI)

// Q4TROW unpacks 16 groups of the row at p into 512 bytes at off(DI):
// register t = 2i (low nibbles of Q_i) or 2i+1 (high) at off + 64t.
#define Q4TROW(p, o0, o1, o2, o3, o4, o5, o6, o7) \
	VMOVDQU64 (p), Z0; \
	VMOVDQU64 64(p), Z1; \
	VMOVDQU64 128(p), Z2; \
	VMOVDQU64 192(p), Z3; \
	XPOSE4(Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7); \
	Q4TSPLIT(Z0, o0, o1); \
	Q4TSPLIT(Z1, o2, o3); \
	Q4TSPLIT(Z2, o4, o5); \
	Q4TSPLIT(Z3, o6, o7)

// Q4TRUNGS stores a row's 16 rungs in lanesT order at off(DI).
#define Q4TRUNGS(coff, loff, off) \
	MOVQ            coff(DX), AX; \
	VBROADCASTI32X4 (AX)(SI*1), Z10; \
	VPSHUFB         Z28, Z10, Z10; \
	VPSRLVD         Z29, Z10, Z10; \
	MOVQ            loff(DX), AX; \
	VMOVUPS         (AX), Z30; \
	VPERMI2PS       64(AX), Z30, Z10; \
	VPERMPS         Z10, Z27, Z10; \
	VMOVUPS         Z10, off(DI)

// func q4tpUnpack4TAVX512(rows *[4]q4row, gpr int, dst *byte)
//
// gpr is a multiple of 16. Per 16 groups, dst gets 2304 bytes: each row's
// 512 unpacked bytes, then each row's 16 rungs (64 bytes) in lanesT order.
TEXT ·q4tpUnpack4TAVX512(SB), NOSPLIT, $0-24
	MOVQ rows+0(FP), DX
	LADDERS
	MOVQ 0(DX), R8
	MOVQ 32(DX), R9
	MOVQ 64(DX), R10
	MOVQ 96(DX), R11
	MOVQ gpr+8(FP), CX
	SHRQ $4, CX
	MOVQ dst+16(FP), DI
	MOVL         $0x0f0f0f0f, AX
	VPBROADCASTD AX, Z31
	VMOVDQU32    codeBytes<>(SB), Z28
	VMOVDQU32    codeShift16<>(SB), Z29
	VMOVDQU32    lanesT<>(SB), Z27
	XORQ         SI, SI

ut:
	Q4TROW(R8, 0, 64, 128, 192, 256, 320, 384, 448)
	Q4TROW(R9, 512, 576, 640, 704, 768, 832, 896, 960)
	Q4TROW(R10, 1024, 1088, 1152, 1216, 1280, 1344, 1408, 1472)
	Q4TROW(R11, 1536, 1600, 1664, 1728, 1792, 1856, 1920, 1984)
	Q4TRUNGS(8, 16, 2048)
	Q4TRUNGS(40, 48, 2112)
	Q4TRUNGS(72, 80, 2176)
	Q4TRUNGS(104, 112, 2240)
	ADDQ $256, R8
	ADDQ $256, R9
	ADDQ $256, R10
	ADDQ $256, R11
	ADDQ $10, SI
	ADDQ $2304, DI
	DECQ CX
	JNZ  ut

	VZEROUPPER
	RET

// Q4TSTEP is input register x against register t of the four rows (at
// off + 512i of R8) into the int32 accumulators a0..a3.
#define Q4TSTEP(x, off, a0, a1, a2, a3) \
	VMOVDQU64 off(R8), Z22; \
	VMOVDQU64 off+512(R8), Z23; \
	VMOVDQU64 off+1024(R8), Z24; \
	VMOVDQU64 off+1536(R8), Z25; \
	VPDPBUSD  x, Z22, a0; \
	VPDPBUSD  x, Z23, a1; \
	VPDPBUSD  x, Z24, a2; \
	VPDPBUSD  x, Z25, a3

// Q4TSCALE adds row i's 16 group sums (a + b, int32) times its rungs (at
// roff(R8)) and the input's block scales Z20 to the accumulator acc.
#define Q4TSCALE(a, b, roff, acc) \
	VPADDD      b, a, a; \
	VCVTDQ2PS   a, a; \
	VMULPS      roff(R8), Z20, b; \
	VFMADD231PS b, a, acc

// func q4tpXposeAVX512(x *byte, d *float32, s *int32, nsc int, dst *byte)
//
// Writes one qNib input of nsc·16 groups in the layout of q4tpMM4TXAVX512
// to dst: per 16 groups the 8 transposed input registers X0..X7 (512
// bytes), then the nsc·16 block scales and biases in lanesT order.
TEXT ·q4tpXposeAVX512(SB), NOSPLIT, $0-40
	MOVQ      x+0(FP), SI
	MOVQ      d+8(FP), BX
	MOVQ      s+16(FP), DX
	MOVQ      nsc+24(FP), CX
	MOVQ      dst+32(FP), DI
	MOVQ      CX, R8
	SHLQ      $9, R8
	ADDQ      DI, R8 // scales
	MOVQ      CX, R9
	SHLQ      $6, R9
	ADDQ      R8, R9 // biases
	VMOVDQU32 lanesT<>(SB), Z27

xt:
	VMOVDQU64 (SI), Z4
	VMOVDQU64 128(SI), Z5
	VMOVDQU64 256(SI), Z6
	VMOVDQU64 384(SI), Z7
	XPOSE4(Z4, Z5, Z6, Z7, Z28, Z29, Z30, Z31)
	VMOVDQU64 64(SI), Z8
	VMOVDQU64 192(SI), Z9
	VMOVDQU64 320(SI), Z10
	VMOVDQU64 448(SI), Z11
	XPOSE4(Z8, Z9, Z10, Z11, Z28, Z29, Z30, Z31)
	VMOVDQU64 Z4, (DI)
	VMOVDQU64 Z8, 64(DI)
	VMOVDQU64 Z5, 128(DI)
	VMOVDQU64 Z9, 192(DI)
	VMOVDQU64 Z6, 256(DI)
	VMOVDQU64 Z10, 320(DI)
	VMOVDQU64 Z7, 384(DI)
	VMOVDQU64 Z11, 448(DI)
	VPERMPS   (BX), Z27, Z20
	VPERMD    (DX), Z27, Z21
	VMOVUPS   Z20, (R8)
	VMOVDQU32 Z21, (R9)
	ADDQ      $512, SI
	ADDQ      $512, DI
	ADDQ      $64, BX
	ADDQ      $64, DX
	ADDQ      $64, R8
	ADDQ      $64, R9
	DECQ      CX
	JNZ       xt

	VZEROUPPER
	RET

// PFSTEP prefetches the next 64·k bytes of the prefetch stream R14 into
// L2 while it is below end (the next block's weights, spread over the
// kernel's loop instead of issued at once).
#define PFSTEP(end, label) \
	CMPQ       R14, end; \
	JAE        label; \
	PREFETCHT1 (R14); \
	ADDQ       $64, R14; \
label:

// func q4tpMM4TXAVX512(w *byte, gpr int, x *byte, xstride int, d *float32, s *int32, bstride, npos int, out *float32, ostride int, pf *byte, pfn int, add bool)
//
// q4tpMM4AVX512 for a block unpacked by q4tpUnpack4TAVX512 and inputs
// transposed by q4tpXposeAVX512 (x, d and s of position j at
// + j·xstride, + j·bstride bytes); prefetches the pfn bytes at pf, two
// lines per 16 groups and position, the rest at the end. With add, the
// dots are added to out instead of stored.
TEXT ·q4tpMM4TXAVX512(SB), NOSPLIT, $0-97
	MOVQ pf+80(FP), R14
	MOVQ pfn+88(FP), AX
	ADDQ R14, AX
	MOVQ AX, pfn+88(FP) // now the end
	MOVQ x+16(FP), SI
	MOVQ d+32(FP), BX
	MOVQ s+40(FP), DX
	MOVQ npos+56(FP), R10
	MOVQ out+64(FP), R11
	MOVQ gpr+8(FP), R9
	SHRQ $4, R9

xpos:
	TESTQ  R10, R10
	JZ     xdone
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	MOVQ   w+0(FP), R8
	MOVQ   SI, DI
	MOVQ   BX, R12
	MOVQ   DX, R13
	MOVQ   R9, CX

xsuper:
	VMOVDQU64 (DI), Z4
	VMOVDQU64 64(DI), Z8
	VMOVDQU64 128(DI), Z5
	VMOVDQU64 192(DI), Z9
	VMOVDQU64 256(DI), Z6
	VMOVDQU64 320(DI), Z10
	VMOVDQU64 384(DI), Z7
	VMOVDQU64 448(DI), Z11
	VMOVUPS   (R12), Z20
	VMOVDQU32 (R13), Z12
	VMOVDQA64 Z12, Z13
	VMOVDQA64 Z12, Z14
	VMOVDQA64 Z12, Z15
	VPXORD    Z16, Z16, Z16
	VPXORD    Z17, Z17, Z17
	VPXORD    Z18, Z18, Z18
	VPXORD    Z19, Z19, Z19
	Q4TSTEP(Z4, 0, Z12, Z13, Z14, Z15)
	Q4TSTEP(Z8, 64, Z16, Z17, Z18, Z19)
	Q4TSTEP(Z5, 128, Z12, Z13, Z14, Z15)
	Q4TSTEP(Z9, 192, Z16, Z17, Z18, Z19)
	Q4TSTEP(Z6, 256, Z12, Z13, Z14, Z15)
	Q4TSTEP(Z10, 320, Z16, Z17, Z18, Z19)
	Q4TSTEP(Z7, 384, Z12, Z13, Z14, Z15)
	Q4TSTEP(Z11, 448, Z16, Z17, Z18, Z19)
	Q4TSCALE(Z12, Z16, 2048, Z0)
	Q4TSCALE(Z13, Z17, 2112, Z1)
	Q4TSCALE(Z14, Z18, 2176, Z2)
	Q4TSCALE(Z15, Z19, 2240, Z3)
	MOVQ      pfn+88(FP), AX
	PFSTEP(AX, xpf0)
	PFSTEP(AX, xpf1)
	ADDQ      $2304, R8
	ADDQ      $512, DI
	ADDQ      $64, R12
	ADDQ      $64, R13
	DECQ      CX
	JNZ       xsuper

	HSUM4
	CMPB    add+96(FP), $0
	JEQ     xstore
	VADDPS  (R11), X0, X0
xstore:
	VMOVUPS X0, (R11)
	ADDQ    ostride+72(FP), R11
	ADDQ    xstride+24(FP), SI
	ADDQ    bstride+48(FP), BX
	ADDQ    bstride+48(FP), DX
	DECQ    R10
	JMP     xpos

xdone:
	MOVQ pfn+88(FP), AX
xpft:
	CMPQ       R14, AX
	JAE        xpfd
	PREFETCHT1 (R14)
	ADDQ       $64, R14
	JMP        xpft
xpfd:
	VZEROUPPER
	RET

// Transposed q8 blocks for small batches (q8_row, q8_2f; rows of a
// multiple of 512 columns). The 512 bytes of a row's 16 blocks, read as
// registers R0..R7 (blocks 2c and 2c+1 in R_c), are transposed by XPOSE4
// in two sets of four: dword lane 4k+c of Q0..Q3 holds 4 bytes of block
// 2c + k/2 (the first 16 of it for even k, the last 16 for odd k), of
// Q4..Q7 of block 8 + 2c + k/2. So two int32 accumulators per row
// collect 4 VPDPBUSDs each before one conversion and scaling (instead of
// one per VPDPBUSD). The inputs take the same transpose, their scales the
// permutations lanesQ8A/B and their biases (-128·Σq) go to the even-k
// lane of each block only.

// lanesQ8A[L] = 2·(L mod 4) + L/8: the block in lane L of Q0..Q3.
DATA lanesQ8A<>+0x00(SB)/8, $0x0000000200000000
DATA lanesQ8A<>+0x08(SB)/8, $0x0000000600000004
DATA lanesQ8A<>+0x10(SB)/8, $0x0000000200000000
DATA lanesQ8A<>+0x18(SB)/8, $0x0000000600000004
DATA lanesQ8A<>+0x20(SB)/8, $0x0000000300000001
DATA lanesQ8A<>+0x28(SB)/8, $0x0000000700000005
DATA lanesQ8A<>+0x30(SB)/8, $0x0000000300000001
DATA lanesQ8A<>+0x38(SB)/8, $0x0000000700000005
GLOBL lanesQ8A<>(SB), RODATA|NOPTR, $64

// lanesQ8B = lanesQ8A + 8: the block in lane L of Q4..Q7.
DATA lanesQ8B<>+0x00(SB)/8, $0x0000000a00000008
DATA lanesQ8B<>+0x08(SB)/8, $0x0000000e0000000c
DATA lanesQ8B<>+0x10(SB)/8, $0x0000000a00000008
DATA lanesQ8B<>+0x18(SB)/8, $0x0000000e0000000c
DATA lanesQ8B<>+0x20(SB)/8, $0x0000000b00000009
DATA lanesQ8B<>+0x28(SB)/8, $0x0000000f0000000d
DATA lanesQ8B<>+0x30(SB)/8, $0x0000000b00000009
DATA lanesQ8B<>+0x38(SB)/8, $0x0000000f0000000d
GLOBL lanesQ8B<>(SB), RODATA|NOPTR, $64

// Q8TROW unpacks 512 columns of the row at p (top bits flipped) to
// off(DI) .. off+511(DI), register t at off + 64t.
#define Q8TROW(p, o0, o1, o2, o3, o4, o5, o6, o7) \
	VPXORD    (p), Z31, Z0; \
	VPXORD    64(p), Z31, Z1; \
	VPXORD    128(p), Z31, Z2; \
	VPXORD    192(p), Z31, Z3; \
	VPXORD    256(p), Z31, Z8; \
	VPXORD    320(p), Z31, Z9; \
	VPXORD    384(p), Z31, Z10; \
	VPXORD    448(p), Z31, Z11; \
	XPOSE4(Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7); \
	XPOSE4(Z8, Z9, Z10, Z11, Z4, Z5, Z6, Z7); \
	VMOVDQU64 Z0, o0(DI); \
	VMOVDQU64 Z1, o1(DI); \
	VMOVDQU64 Z2, o2(DI); \
	VMOVDQU64 Z3, o3(DI); \
	VMOVDQU64 Z8, o4(DI); \
	VMOVDQU64 Z9, o5(DI); \
	VMOVDQU64 Z10, o6(DI); \
	VMOVDQU64 Z11, o7(DI)

// func q8Unpack4TAVX512(w *byte, stride, sb int, dst *byte)
//
// Unpacks four rows (stride bytes apart) of sb 512-column blocks: per
// block, dst gets each row's 512 transposed bytes (2048 in all).
TEXT ·q8Unpack4TAVX512(SB), NOSPLIT, $0-32
	MOVQ         w+0(FP), AX
	MOVQ         stride+8(FP), BX
	MOVQ         sb+16(FP), CX
	MOVQ         dst+24(FP), DI
	LEAQ         (AX)(BX*1), R8
	LEAQ         (AX)(BX*2), R9
	LEAQ         (R9)(BX*1), R10
	MOVL         $0x80808080, DX
	VPBROADCASTD DX, Z31

u8t:
	Q8TROW(AX, 0, 64, 128, 192, 256, 320, 384, 448)
	Q8TROW(R8, 512, 576, 640, 704, 768, 832, 896, 960)
	Q8TROW(R9, 1024, 1088, 1152, 1216, 1280, 1344, 1408, 1472)
	Q8TROW(R10, 1536, 1600, 1664, 1728, 1792, 1856, 1920, 1984)
	ADDQ $512, AX
	ADDQ $512, R8
	ADDQ $512, R9
	ADDQ $512, R10
	ADDQ $2048, DI
	DECQ CX
	JNZ  u8t

	VZEROUPPER
	RET

// func q8XposeAVX512(x *byte, d *float32, s *int32, sb int, dst *byte)
//
// Writes one qPlain input of sb 512-column blocks transposed for
// q8MM4TAVX512 to dst (sb·768 bytes): per block the 8 input registers
// (512 bytes), then per block the scales for Q0..Q3 and Q4..Q7 (128
// bytes), then the biases likewise.
TEXT ·q8XposeAVX512(SB), NOSPLIT, $0-40
	MOVQ      x+0(FP), SI
	MOVQ      d+8(FP), BX
	MOVQ      s+16(FP), DX
	MOVQ      sb+24(FP), CX
	MOVQ      dst+32(FP), DI
	MOVQ      CX, R8
	SHLQ      $9, R8
	ADDQ      DI, R8 // scales
	MOVQ      CX, R9
	SHLQ      $7, R9
	ADDQ      R8, R9 // biases
	VMOVDQU32 lanesQ8A<>(SB), Z26
	VMOVDQU32 lanesQ8B<>(SB), Z27
	MOVL      $0x0f0f, AX
	KMOVW     AX, K1

x8t:
	VMOVDQU64 (SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVDQU64 256(SI), Z8
	VMOVDQU64 320(SI), Z9
	VMOVDQU64 384(SI), Z10
	VMOVDQU64 448(SI), Z11
	XPOSE4(Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7)
	XPOSE4(Z8, Z9, Z10, Z11, Z4, Z5, Z6, Z7)
	VMOVDQU64 Z0, (DI)
	VMOVDQU64 Z1, 64(DI)
	VMOVDQU64 Z2, 128(DI)
	VMOVDQU64 Z3, 192(DI)
	VMOVDQU64 Z8, 256(DI)
	VMOVDQU64 Z9, 320(DI)
	VMOVDQU64 Z10, 384(DI)
	VMOVDQU64 Z11, 448(DI)
	VMOVUPS   (BX), Z12
	VPERMPS   Z12, Z26, Z20
	VPERMPS   Z12, Z27, Z21
	VMOVUPS   Z20, (R8)
	VMOVUPS   Z21, 64(R8)
	VMOVDQU32 (DX), Z13
	VPERMD.Z  Z13, Z26, K1, Z22
	VPERMD.Z  Z13, Z27, K1, Z23
	VMOVDQU32 Z22, (R9)
	VMOVDQU32 Z23, 64(R9)
	ADDQ      $512, SI
	ADDQ      $512, DI
	ADDQ      $64, BX
	ADDQ      $64, DX
	ADDQ      $128, R8
	ADDQ      $128, R9
	DECQ      CX
	JNZ       x8t

	VZEROUPPER
	RET

// Q8TSTEP is input register x against register t of the four rows (at
// off + 512i of R8) into the int32 accumulators a0..a3.
#define Q8TSTEP(x, off, a0, a1, a2, a3) Q4TSTEP(x, off, a0, a1, a2, a3)

// Q8TSCALE adds row i's accumulators a (Q0..Q3) and b (Q4..Q7), converted
// and times the block scales Z20 and Z21, to acc.
#define Q8TSCALE(a, b, acc) \
	VCVTDQ2PS   a, a; \
	VCVTDQ2PS   b, b; \
	VFMADD231PS Z20, a, acc; \
	VFMADD231PS Z21, b, acc

// func q8MM4TAVX512(w *byte, sb int, x *byte, xstride int, d *float32, s *int32, bstride, npos int, out *float32, ostride int, scale *[4]float32, pf *byte, pfn int)
//
// q8MM4AVX512 for a block unpacked by q8Unpack4TAVX512 and inputs
// transposed by q8XposeAVX512 (d and s pointing at their scales and
// biases, position j's at + j·bstride bytes); prefetches the pfn bytes at
// pf, four lines per 512 columns and position, the rest at the end.
TEXT ·q8MM4TAVX512(SB), NOSPLIT, $0-104
	MOVQ    pf+88(FP), R14
	MOVQ    pfn+96(FP), AX
	ADDQ    R14, AX
	MOVQ    AX, pfn+96(FP) // now the end
	MOVQ    x+16(FP), SI
	MOVQ    d+32(FP), BX
	MOVQ    s+40(FP), DX
	MOVQ    npos+56(FP), R10
	MOVQ    out+64(FP), R11
	MOVQ    scale+80(FP), AX
	VMOVUPS (AX), X28
	MOVQ    sb+8(FP), R9

q8pos:
	TESTQ  R10, R10
	JZ     q8done
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	MOVQ   w+0(FP), R8
	MOVQ   SI, DI
	MOVQ   BX, R12
	MOVQ   DX, R13
	MOVQ   R9, CX

q8sb:
	VMOVDQU64 (DI), Z4
	VMOVDQU64 64(DI), Z5
	VMOVDQU64 128(DI), Z6
	VMOVDQU64 192(DI), Z7
	VMOVDQU64 256(DI), Z8
	VMOVDQU64 320(DI), Z9
	VMOVDQU64 384(DI), Z10
	VMOVDQU64 448(DI), Z11
	VMOVUPS   (R12), Z20
	VMOVUPS   64(R12), Z21
	VMOVDQU32 (R13), Z12
	VMOVDQU32 64(R13), Z16
	VMOVDQA64 Z12, Z13
	VMOVDQA64 Z12, Z14
	VMOVDQA64 Z12, Z15
	VMOVDQA64 Z16, Z17
	VMOVDQA64 Z16, Z18
	VMOVDQA64 Z16, Z19
	Q8TSTEP(Z4, 0, Z12, Z13, Z14, Z15)
	Q8TSTEP(Z8, 256, Z16, Z17, Z18, Z19)
	Q8TSTEP(Z5, 64, Z12, Z13, Z14, Z15)
	Q8TSTEP(Z9, 320, Z16, Z17, Z18, Z19)
	Q8TSTEP(Z6, 128, Z12, Z13, Z14, Z15)
	Q8TSTEP(Z10, 384, Z16, Z17, Z18, Z19)
	Q8TSTEP(Z7, 192, Z12, Z13, Z14, Z15)
	Q8TSTEP(Z11, 448, Z16, Z17, Z18, Z19)
	Q8TSCALE(Z12, Z16, Z0)
	Q8TSCALE(Z13, Z17, Z1)
	Q8TSCALE(Z14, Z18, Z2)
	Q8TSCALE(Z15, Z19, Z3)
	MOVQ      pfn+96(FP), AX
	PFSTEP(AX, q8pf0)
	PFSTEP(AX, q8pf1)
	PFSTEP(AX, q8pf2)
	PFSTEP(AX, q8pf3)
	ADDQ      $2048, R8
	ADDQ      $512, DI
	ADDQ      $128, R12
	ADDQ      $128, R13
	DECQ      CX
	JNZ       q8sb

	HSUM4
	VMULPS  X28, X0, X0
	VMOVUPS X0, (R11)
	ADDQ    ostride+72(FP), R11
	ADDQ    xstride+24(FP), SI
	ADDQ    bstride+48(FP), BX
	ADDQ    bstride+48(FP), DX
	DECQ    R10
	JMP     q8pos

q8done:
	MOVQ pfn+96(FP), AX
q8pft:
	CMPQ       R14, AX
	JAE        q8pfd
	PREFETCHT1 (R14)
	ADDQ       $64, R14
	JMP        q8pft
q8pfd:
	VZEROUPPER
	RET

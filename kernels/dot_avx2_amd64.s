//go:build amd64 && !purego

#include "textflag.h"

// AVX2 (+FMA, F16C) twins of the AVX-512 kernels for CPUs without
// AVX-512 VNNI. They handle whole blocks only (32 columns for q8, one
// group for q4tp, 16 for the float formats); the Go wrappers in
// dot_amd64.go add the remaining columns. Same prefetching as dot_amd64.s.

#define PFAHEAD 8192

// HSUM4Y reduces the accumulators Y0..Y3 to their four lane sums in X0
// (Y4 clobbered).
#define HSUM4Y \
	VHADDPS      Y1, Y0, Y0; \
	VHADDPS      Y3, Y2, Y2; \
	VHADDPS      Y2, Y0, Y0; \
	VEXTRACTF128 $1, Y0, X4; \
	VADDPS       X4, X0, X0

// Q8ROW2 is one row of q8Dot4AVX2 over a block of 32: |w| times the input
// Y5 carrying w's sign, pairwise to int16 and int32, converted and scaled
// by the block scale Y6.
#define Q8ROW2(addr, w, t, acc) \
	VMOVDQU     addr, w; \
	VPSIGNB     w, Y5, t; \
	VPABSB      w, w; \
	VPMADDUBSW  t, w, w; \
	VPMADDWD    Y7, w, w; \
	VCVTDQ2PS   w, w; \
	VFMADD231PS Y6, w, acc

// func q8Dot4AVX2(w *byte, stride, blocks int, x *byte, d *float32, out *[4]float32)
TEXT ·q8Dot4AVX2(SB), NOSPLIT, $0-48
	MOVQ w+0(FP), AX
	MOVQ stride+8(FP), BX
	MOVQ blocks+16(FP), CX
	MOVQ x+24(FP), SI
	MOVQ d+32(FP), DI
	LEAQ (AX)(BX*2), DX
	ADDQ BX, DX
	LEAQ PFAHEAD(DX)(BX*1), R11
	MOVL         $0x00010001, R9
	VMOVD        R9, X7
	VPBROADCASTD X7, Y7
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	TESTQ CX, CX
	JZ    q8ydone

q8yloop:
	PREFETCHT0   (R11)
	PREFETCHT0   64(R11)
	ADDQ         $128, R11
	VMOVDQU      (SI), Y5
	VBROADCASTSS (DI), Y6
	Q8ROW2((AX), Y8, Y9, Y0)
	Q8ROW2((AX)(BX*1), Y10, Y11, Y1)
	Q8ROW2((AX)(BX*2), Y12, Y13, Y2)
	Q8ROW2((DX), Y14, Y15, Y3)
	ADDQ $32, AX
	ADDQ $32, DX
	ADDQ $32, SI
	ADDQ $4, DI
	DECQ CX
	JNZ  q8yloop

q8ydone:
	HSUM4Y
	MOVQ    out+40(FP), AX
	VMOVUPS X0, (AX)
	VZEROUPPER
	RET

// Q4ROW2 is one row of q4tpDot4AVX2 over one group: the 16 nibble bytes
// split to [low | high] and dotted with the input Y5 ([even | odd]) via
// int16 pairs to int32, plus the group's bias Y6 (lane 0); the group's
// rung (its code at bit 5g of the row's codes: byte R9, shift CX) times
// its block scale X7 scales the sum into acc. coff, loff: offsets of the
// row's code and ladder pointers in the q4row array at R8.
#define Q4ROW2(nib, coff, loff, xn, yn, xh, yh, acc) \
	VMOVDQU      (nib), xn; \
	VPSRLW       $4, xn, xh; \
	VPAND        X12, xn, xn; \
	VPAND        X12, xh, xh; \
	VINSERTI128  $1, xh, yn, yn; \
	VPMADDUBSW   Y5, yn, yn; \
	VPMADDWD     Y13, yn, yn; \
	VPADDD       Y6, yn, yn; \
	VCVTDQ2PS    yn, yn; \
	MOVQ         coff(R8), R12; \
	MOVWLZX      (R12)(R9*1), R12; \
	SHRL         CX, R12; \
	ANDL         $31, R12; \
	MOVQ         loff(R8), R13; \
	VMULSS       (R13)(R12*4), X7, xh; \
	VBROADCASTSS xh, yh; \
	VFMADD231PS  yh, yn, acc

// func q4tpDot4AVX2(rows *[4]q4row, gpr int, x *byte, d *float32, s *int32, out *[4]float32)
TEXT ·q4tpDot4AVX2(SB), NOSPLIT, $0-48
	MOVQ rows+0(FP), R8
	MOVQ 0(R8), AX
	MOVQ 32(R8), BX
	MOVQ 64(R8), DX
	MOVQ 96(R8), SI
	MOVQ x+16(FP), DI
	MOVQ d+24(FP), R11
	MOVL         $0x0f0f0f0f, R12
	VMOVD        R12, X12
	VPBROADCASTD X12, Y12
	MOVL         $0x00010001, R12
	VMOVD        R12, X13
	VPBROADCASTD X13, Y13
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ   R10, R10 // group

q4yloop:
	CMPQ R10, gpr+8(FP)
	JGE  q4ydone
	// The group's inputs: chunk g/4 (128 bytes), slot g%4 (16 bytes).
	MOVQ        R10, R12
	ANDQ        $-4, R12
	SHLQ        $5, R12
	MOVQ        R10, R13
	ANDQ        $3, R13
	SHLQ        $4, R13
	ADDQ        R13, R12
	VMOVDQU     (DI)(R12*1), X5
	VINSERTI128 $1, 64(DI)(R12*1), Y5, Y5
	VMOVSS      (R11)(R10*4), X7
	MOVQ        s+32(FP), R13
	VMOVD       (R13)(R10*4), X6
	LEAQ        (R10)(R10*4), R9
	MOVQ        R9, CX
	SHRQ        $3, R9
	ANDQ        $7, CX
	Q4ROW2(AX, 8, 16, X8, Y8, X9, Y9, Y0)
	Q4ROW2(BX, 40, 48, X10, Y10, X11, Y11, Y1)
	Q4ROW2(DX, 72, 80, X8, Y8, X9, Y9, Y2)
	Q4ROW2(SI, 104, 112, X10, Y10, X11, Y11, Y3)
	ADDQ $16, AX
	ADDQ $16, BX
	ADDQ $16, DX
	ADDQ $16, SI
	INCQ R10
	JMP  q4yloop

q4ydone:
	HSUM4Y
	MOVQ    out+40(FP), AX
	VMOVUPS X0, (AX)
	VZEROUPPER
	RET

// Float formats, 16 columns per step (the Go wrapper adds the rest).
#define FYROW_F32(addr, t, xr, acc) VFMADD231PS addr, xr, acc
#define FYROW_F16(addr, t, xr, acc) VCVTPH2PS addr, t; VFMADD231PS t, xr, acc
#define FYROW_BF16(addr, t, xr, acc) VPMOVZXWD addr, t; VPSLLD $16, t, t; VFMADD231PS t, xr, acc

// func f32Dot4AVX2(w *float32, stride, n int, x *float32, out *[4]float32)
//
// Dots over the first n&^15 columns; stride in bytes (0: one row).
TEXT ·f32Dot4AVX2(SB), NOSPLIT, $0-40
	MOVQ   w+0(FP), AX
	MOVQ   stride+8(FP), BX
	MOVQ   n+16(FP), CX
	MOVQ   x+24(FP), SI
	LEAQ   (AX)(BX*2), DX
	ADDQ   BX, DX
	LEAQ   PFAHEAD(DX)(BX*1), R11
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	SHRQ   $4, CX
	JZ     f32ydone

f32yloop:
	PREFETCHT0 0(R11)
	PREFETCHT0 64(R11)
	PREFETCHT0 128(R11)
	PREFETCHT0 192(R11)
	ADDQ       $256, R11
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	FYROW_F32((AX), Y12, Y4, Y0)
	FYROW_F32((AX)(BX*1), Y13, Y4, Y1)
	FYROW_F32((AX)(BX*2), Y14, Y4, Y2)
	FYROW_F32((DX), Y15, Y4, Y3)
	FYROW_F32(32(AX), Y12, Y5, Y8)
	FYROW_F32(32(AX)(BX*1), Y13, Y5, Y9)
	FYROW_F32(32(AX)(BX*2), Y14, Y5, Y10)
	FYROW_F32(32(DX), Y15, Y5, Y11)
	ADDQ $64, AX
	ADDQ $64, DX
	ADDQ $64, SI
	DECQ CX
	JNZ  f32yloop

f32ydone:
	VADDPS  Y8, Y0, Y0
	VADDPS  Y9, Y1, Y1
	VADDPS  Y10, Y2, Y2
	VADDPS  Y11, Y3, Y3
	HSUM4Y
	MOVQ    out+32(FP), AX
	VMOVUPS X0, (AX)
	VZEROUPPER
	RET

// func f16Dot4AVX2(w *uint16, stride, n int, x *float32, out *[4]float32)
//
// Dots over the first n&^15 columns; stride in bytes (0: one row).
TEXT ·f16Dot4AVX2(SB), NOSPLIT, $0-40
	MOVQ   w+0(FP), AX
	MOVQ   stride+8(FP), BX
	MOVQ   n+16(FP), CX
	MOVQ   x+24(FP), SI
	LEAQ   (AX)(BX*2), DX
	ADDQ   BX, DX
	LEAQ   PFAHEAD(DX)(BX*1), R11
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	SHRQ   $4, CX
	JZ     f16ydone

f16yloop:
	PREFETCHT0 0(R11)
	PREFETCHT0 64(R11)
	ADDQ       $128, R11
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	FYROW_F16((AX), Y12, Y4, Y0)
	FYROW_F16((AX)(BX*1), Y13, Y4, Y1)
	FYROW_F16((AX)(BX*2), Y14, Y4, Y2)
	FYROW_F16((DX), Y15, Y4, Y3)
	FYROW_F16(16(AX), Y12, Y5, Y8)
	FYROW_F16(16(AX)(BX*1), Y13, Y5, Y9)
	FYROW_F16(16(AX)(BX*2), Y14, Y5, Y10)
	FYROW_F16(16(DX), Y15, Y5, Y11)
	ADDQ $32, AX
	ADDQ $32, DX
	ADDQ $64, SI
	DECQ CX
	JNZ  f16yloop

f16ydone:
	VADDPS  Y8, Y0, Y0
	VADDPS  Y9, Y1, Y1
	VADDPS  Y10, Y2, Y2
	VADDPS  Y11, Y3, Y3
	HSUM4Y
	MOVQ    out+32(FP), AX
	VMOVUPS X0, (AX)
	VZEROUPPER
	RET

// func bf16Dot4AVX2(w *uint16, stride, n int, x *float32, out *[4]float32)
//
// Dots over the first n&^15 columns; stride in bytes (0: one row).
TEXT ·bf16Dot4AVX2(SB), NOSPLIT, $0-40
	MOVQ   w+0(FP), AX
	MOVQ   stride+8(FP), BX
	MOVQ   n+16(FP), CX
	MOVQ   x+24(FP), SI
	LEAQ   (AX)(BX*2), DX
	ADDQ   BX, DX
	LEAQ   PFAHEAD(DX)(BX*1), R11
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	SHRQ   $4, CX
	JZ     bf16ydone

bf16yloop:
	PREFETCHT0 0(R11)
	PREFETCHT0 64(R11)
	ADDQ       $128, R11
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	FYROW_BF16((AX), Y12, Y4, Y0)
	FYROW_BF16((AX)(BX*1), Y13, Y4, Y1)
	FYROW_BF16((AX)(BX*2), Y14, Y4, Y2)
	FYROW_BF16((DX), Y15, Y4, Y3)
	FYROW_BF16(16(AX), Y12, Y5, Y8)
	FYROW_BF16(16(AX)(BX*1), Y13, Y5, Y9)
	FYROW_BF16(16(AX)(BX*2), Y14, Y5, Y10)
	FYROW_BF16(16(DX), Y15, Y5, Y11)
	ADDQ $32, AX
	ADDQ $32, DX
	ADDQ $64, SI
	DECQ CX
	JNZ  bf16yloop

bf16ydone:
	VADDPS  Y8, Y0, Y0
	VADDPS  Y9, Y1, Y1
	VADDPS  Y10, Y2, Y2
	VADDPS  Y11, Y3, Y3
	HSUM4Y
	MOVQ    out+32(FP), AX
	VMOVUPS X0, (AX)
	VZEROUPPER
	RET

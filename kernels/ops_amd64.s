//go:build amd64 && !purego

#include "textflag.h"

// AVX-512 elementwise kernels: Dot, AXPY and SiLUMul (ops.go has the
// plain Go versions, which the tests compare with these). Tails go
// through masked loads and stores.

DATA expLog2e<>+0(SB)/4, $0x3fb8aa3b
GLOBL expLog2e<>(SB), RODATA|NOPTR, $4
DATA expLn2Hi<>+0(SB)/4, $0x3f318000
GLOBL expLn2Hi<>(SB), RODATA|NOPTR, $4
DATA expLn2Lo<>+0(SB)/4, $0xb95e8083
GLOBL expLn2Lo<>(SB), RODATA|NOPTR, $4
DATA expOne<>+0(SB)/4, $0x3f800000
GLOBL expOne<>(SB), RODATA|NOPTR, $4
DATA expC0<>+0(SB)/4, $0x3f800000
GLOBL expC0<>(SB), RODATA|NOPTR, $4
DATA expC1<>+0(SB)/4, $0x3f800000
GLOBL expC1<>(SB), RODATA|NOPTR, $4
DATA expC2<>+0(SB)/4, $0x3f000000
GLOBL expC2<>(SB), RODATA|NOPTR, $4
DATA expC3<>+0(SB)/4, $0x3e2aaaab
GLOBL expC3<>(SB), RODATA|NOPTR, $4
DATA expC4<>+0(SB)/4, $0x3d2aaaab
GLOBL expC4<>(SB), RODATA|NOPTR, $4
DATA expC5<>+0(SB)/4, $0x3c088889
GLOBL expC5<>(SB), RODATA|NOPTR, $4
DATA expC6<>+0(SB)/4, $0x3ab60b61
GLOBL expC6<>(SB), RODATA|NOPTR, $4
DATA expC7<>+0(SB)/4, $0x39500d01
GLOBL expC7<>(SB), RODATA|NOPTR, $4

// EXPE replaces x by e^x (Cody–Waite reduction x = n·ln2 + r and a degree-7
// polynomial, as Exp in ops.go; within about 2 ulp, 0 or +Inf out of
// range, NaN kept). Clobbers n and p.
#define EXPE(x, n, p) \
	VMULPS.BCST       expLog2e<>(SB), x, n; \
	VRNDSCALEPS       $0, n, n; \
	VFNMADD231PS.BCST expLn2Hi<>(SB), n, x; \
	VFNMADD231PS.BCST expLn2Lo<>(SB), n, x; \
	VBROADCASTSS      expC7<>(SB), p; \
	VFMADD213PS.BCST  expC6<>(SB), x, p; \
	VFMADD213PS.BCST  expC5<>(SB), x, p; \
	VFMADD213PS.BCST  expC4<>(SB), x, p; \
	VFMADD213PS.BCST  expC3<>(SB), x, p; \
	VFMADD213PS.BCST  expC2<>(SB), x, p; \
	VFMADD213PS.BCST  expC1<>(SB), x, p; \
	VFMADD213PS.BCST  expC0<>(SB), x, p; \
	VSCALEFPS         n, p, x

// TAILMASK sets K1 to the low min(CX, 16) bits.
#define TAILMASK \
	MOVQ  $-1, R9; \
	CMPQ  CX, $16; \
	JGE   4(PC); \
	MOVQ  $1, R9; \
	SHLQ  CX, R9; \
	DECQ  R9; \
	KMOVW R9, K1

// func dotAVX512(a, b *float32, n int) float32
TEXT ·dotAVX512(SB), NOSPLIT, $0-28
	MOVQ   a+0(FP), SI
	MOVQ   b+8(FP), DI
	MOVQ   n+16(FP), CX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3

dloop64:
	CMPQ        CX, $64
	JLT         dtail
	VMOVUPS     (SI), Z4
	VMOVUPS     64(SI), Z5
	VMOVUPS     128(SI), Z6
	VMOVUPS     192(SI), Z7
	VFMADD231PS (DI), Z4, Z0
	VFMADD231PS 64(DI), Z5, Z1
	VFMADD231PS 128(DI), Z6, Z2
	VFMADD231PS 192(DI), Z7, Z3
	ADDQ        $256, SI
	ADDQ        $256, DI
	SUBQ        $64, CX
	JMP         dloop64

dtail:
	TESTQ CX, CX
	JLE   ddone
	TAILMASK
	VMOVUPS.Z   (SI), K1, Z4
	VMOVUPS.Z   (DI), K1, Z5
	VFMADD231PS Z5, Z4, Z0
	ADDQ        $64, SI
	ADDQ        $64, DI
	SUBQ        $16, CX
	JMP         dtail

ddone:
	VADDPS        Z1, Z0, Z0
	VADDPS        Z3, Z2, Z2
	VADDPS        Z2, Z0, Z0
	VEXTRACTF32X8 $1, Z0, Y1
	VADDPS        Y1, Y0, Y0
	VEXTRACTF128  $1, Y0, X1
	VADDPS        X1, X0, X0
	VHADDPS       X0, X0, X0
	VHADDPS       X0, X0, X0
	VMOVSS        X0, ret+24(FP)
	VZEROUPPER
	RET

// func axpyAVX512(y *float32, a float32, x *float32, n int)
TEXT ·axpyAVX512(SB), NOSPLIT, $0-32
	MOVQ         y+0(FP), DI
	VBROADCASTSS a+8(FP), Z8
	MOVQ         x+16(FP), SI
	MOVQ         n+24(FP), CX

aloop32:
	CMPQ        CX, $32
	JLT         atail
	VMOVUPS     (DI), Z0
	VMOVUPS     64(DI), Z1
	VFMADD231PS (SI), Z8, Z0
	VFMADD231PS 64(SI), Z8, Z1
	VMOVUPS     Z0, (DI)
	VMOVUPS     Z1, 64(DI)
	ADDQ        $128, SI
	ADDQ        $128, DI
	SUBQ        $32, CX
	JMP         aloop32

atail:
	TESTQ CX, CX
	JLE   adone
	TAILMASK
	VMOVUPS.Z   (DI), K1, Z0
	VMOVUPS.Z   (SI), K1, Z1
	VFMADD231PS Z1, Z8, Z0
	VMOVUPS     Z0, K1, (DI)
	ADDQ        $64, SI
	ADDQ        $64, DI
	SUBQ        $16, CX
	JMP         atail

adone:
	VZEROUPPER
	RET

// func siluMulAVX512(a, b *float32, n int)
//
// a[i] = a[i]/(1+e^-a[i])·b[i].
TEXT ·siluMulAVX512(SB), NOSPLIT, $0-24
	MOVQ         a+0(FP), DI
	MOVQ         b+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS expOne<>(SB), Z9
	VPXORD       Z10, Z10, Z10
	KXNORW       K1, K1, K1

sloop:
	TESTQ CX, CX
	JLE   sdone
	TAILMASK
	VMOVUPS.Z   (DI), K1, Z0
	VMOVUPS.Z   (SI), K1, Z1
	VSUBPS      Z0, Z10, Z2
	EXPE(Z2, Z3, Z4)
	VADDPS      Z9, Z2, Z2
	VDIVPS      Z2, Z0, Z0
	VMULPS      Z1, Z0, Z0
	VMOVUPS     Z0, K1, (DI)
	ADDQ        $64, SI
	ADDQ        $64, DI
	SUBQ        $16, CX
	JMP         sloop

sdone:
	VZEROUPPER
	RET

// func expSumAVX512(x *float32, n int, mx float32) float64
//
// x[i] = e^(x[i]-mx) (float32, as Softmax), returning Σ x[i] in float64.
TEXT ·expSumAVX512(SB), NOSPLIT, $0-32
	MOVQ         x+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS mx+16(FP), Z9
	VPXORQ       Z10, Z10, Z10
	VPXORQ       Z11, Z11, Z11

eloop:
	TESTQ CX, CX
	JLE   edone
	TAILMASK
	VMOVUPS.Z     (DI), K1, Z0
	VSUBPS        Z9, Z0, Z0
	EXPE(Z0, Z3, Z4)
	VMOVUPS.Z     Z0, K1, Z0
	VMOVUPS       Z0, K1, (DI)
	VCVTPS2PD     Y0, Z1
	VEXTRACTF32X8 $1, Z0, Y2
	VCVTPS2PD     Y2, Z2
	VADDPD        Z1, Z10, Z10
	VADDPD        Z2, Z11, Z11
	ADDQ          $64, DI
	SUBQ          $16, CX
	JMP           eloop

edone:
	VADDPD        Z11, Z10, Z10
	VEXTRACTF64X4 $1, Z10, Y11
	VADDPD        Y11, Y10, Y10
	VEXTRACTF128  $1, Y10, X11
	VADDPD        X11, X10, X10
	VHADDPD       X10, X10, X10
	VMOVSD        X10, ret+24(FP)
	VZEROUPPER
	RET

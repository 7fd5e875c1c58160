#include "textflag.h"

// func prefetchRecord(rec, blob uintptr)
TEXT ·prefetchRecord(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ	rec+0(FP), AX
	MOVQ	blob+8(FP), BX
	PREFETCHT0	(AX)
	PREFETCHT0	(BX)
	PREFETCHT0	64(BX)
	PREFETCHT0	128(BX)
	PREFETCHT0	192(BX)
	PREFETCHT0	256(BX)
	RET

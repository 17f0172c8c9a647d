package prefetch

import (
	"testing"
	"unsafe"
)

// Line is a hint: any address is harmless, including none at all and one
// past the end of memory, and the memory it names is unchanged.
func TestLineAnyAddress(t *testing.T) {
	buf := make([]byte, 256)
	for i := range buf {
		buf[i] = byte(i)
	}
	for _, addr := range []uintptr{0, 1, ^uintptr(0), ^uintptr(0) - 63, uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&buf[200]))} {
		Line(addr)
	}
	for i := range buf {
		if buf[i] != byte(i) {
			t.Fatalf("buf[%d] = %d after Line, want %d", i, buf[i], i)
		}
	}
}

func BenchmarkLine(b *testing.B) {
	buf := make([]byte, 1<<20)
	base := uintptr(unsafe.Pointer(&buf[0]))
	i := uintptr(0)
	for b.Loop() {
		Line(base + i&(1<<20-1))
		i += 4096 + 64
	}
}

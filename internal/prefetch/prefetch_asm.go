//go:build amd64 || arm64

package prefetch

// Line asks the processor to bring the cache line holding addr into its
// caches.
func Line(addr uintptr)

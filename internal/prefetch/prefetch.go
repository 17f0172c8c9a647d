// Package prefetch asks the processor to start loading a cache line before
// the code that needs it runs: a hint, not a read. It never faults, whatever
// the address, and it has no effect on what a program computes, so an
// address may be stale or made from values read without a lock; the race
// detector does not see it. On processors without a prefetch instruction
// that this package knows, Line does nothing.
package prefetch

// LineSize is the cache line size this package assumes in deciding which
// lines a range of memory spans: 64 bytes, the line of amd64 processors
// and of most arm64 ones. On a processor with larger lines, a hint for a
// line it already has is only a wasted instruction.
const LineSize = 64

// Package prefetch asks the processor to start loading a cache line before
// the code that needs it runs: a hint, not a read. It never faults, whatever
// the address, and it has no effect on what a program computes, so an
// address may be stale or made from values read without a lock; the race
// detector does not see it. On processors without a prefetch instruction
// that this package knows, Line does nothing.
package prefetch

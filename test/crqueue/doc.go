// Package crqueue benchmarks controller-runtime's priorityqueue at the sizes
// of the core's BenchmarkScale; see BENCHMARKS.md.
package crqueue

// Package crqueue benchmarks controller-runtime's priorityqueue, in a
// module of its own (controller-runtime never shares a module with
// k8s.io/kubernetes): BenchmarkScale at the sizes of the core's, and
// BenchmarkCompare and BenchmarkEndToEnd under the names test/benchmarks
// gives the other queues, on the same harness (test/queuebench); see
// BENCHMARKS.md.
package crqueue

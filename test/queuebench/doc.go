// Package queuebench is the harness of the side-by-side queue benchmarks:
// the workloads, the timing and the checks that BenchmarkCompare and
// BenchmarkEndToEnd run against every implementation. The implementations
// live where their dependencies may: dispatch, client-go's workqueue and
// kube-scheduler's APIDispatcher in test/benchmarks (which needs
// k8s.io/kubernetes), controller-runtime's priorityqueue in test/crqueue
// (a module of its own). Both run this package, so their results, under
// the same benchmark names, can be read side by side with benchstat; see
// BENCHMARKS.md.
//
// Compare and CheckTargets take CompareImpl values (compare.go);
// EndToEnd and CheckEndToEnd take E2EImpl values (e2e.go). Nothing here
// is safe to share between concurrent benchmarks: each call builds its
// own queues.
package queuebench

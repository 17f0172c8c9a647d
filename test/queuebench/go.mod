// Unpublished: the workloads and measurements that test/benchmarks and
// test/crqueue share, so that queues benchmarked in those two modules (one
// with k8s.io/kubernetes, one with controller-runtime) run the same
// harness. It needs nothing but the standard library.
module github.com/coalescer/dispatch/test/queuebench

go 1.26.0

require go.uber.org/goleak v1.3.0

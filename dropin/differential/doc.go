// Package differential holds tests, and nothing else: a differential
// harness that runs the same script through upstream's dispatcher
// (k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher) and through the
// drop-in (../apidispatcher), and compares what a caller of either can
// observe: what each Add returns, what each call's OnFinish receives, the
// requests each call's Execute sends (what a status patch sets, where a
// binding binds) and how the server answers them, what SyncObject returns,
// which calls a plugin's call is asked to Merge with, the executions
// kube-scheduler's metrics record (metrics_test.go), and the pods as the
// server has them at the end.
//
// A script (steps_test.go) is a sequence of steps — Run; Add of upstream's
// own PodStatusPatchCall and PodBindingCall, made with their constructors,
// or of a plugin-like call of the tests' own (calls_test.go); SyncObject,
// of a pod or of an object that is not one; hold the next request for a
// pod at the server; release it with success or an error (a 403, 404, 409
// or one that is no API status); Close — over a fake clientset whose
// requests can be held (server_test.go). Both dispatchers run in one testing/synctest bubble,
// and every step is followed by synctest.Wait, so what each step leads to
// is settled, the same on every run (play_test.go). The traces are then
// compared, less the differences that are the drop-in's by design, each
// named where it is excused (compare_test.go).
//
// The tests: TestScripts, hand-worked cases of upstream's rules for an
// object whose call is in flight, upstream's trace checked too; a seeded
// random mode, TestRandomScripts, which shrinks and prints a script that
// differs (-differential.n, -differential.seed, -differential.steps);
// TestCloseWithCallsInFlight, what a call in flight at Close is told; and
// TestStatusPatchAsBindingStarts, in real time, which counts status
// patches sent after a pod's binding when they are added as it starts
// (-differential.pods). TestKnownDifferences (-differential.known) shows
// what the comparisons excuse. TestBindingsBesidePreemption runs upstream's
// PodBindingCalls through each dispatcher on a real clientset, whose token
// bucket a dozen other goroutines wait on too (async preemption deleting
// victims), and compares how fast the bindings drain.
//
//	go test -race ./dropin/differential
//	go test -race ./dropin/differential -run Random -differential.n 5000 -differential.seed 0
package differential

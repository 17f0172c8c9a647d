// Package integration holds the tests of github.com/coalescer/dispatch
// against a real kube-apiserver and etcd, started by package
// [github.com/coalescer/dispatch/kube/integration/apiserver].
//
// TestAPIServerSmoke checks the test stack itself; TestScenarios runs the
// kube adapter's scenarios against it — bindings during a status-patch
// storm, lost responses, stale patches, pods deleted under queued calls,
// server throttling — asserting on what reached the server.
//
// They need an etcd binary ($ETCD_BIN or etcd in $PATH; .ci/run installs
// Debian's etcd-server) and fail without one.
package integration

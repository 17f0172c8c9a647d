// Package integration holds the tests of github.com/coalescer/dispatch
// against a real kube-apiserver and etcd, started by package
// [github.com/coalescer/dispatch/test/integration/apiserver].
//
// TestAPIServerSmoke checks the test stack itself; TestScenarios runs the
// kube adapter's scenarios against it — bindings during a status-patch
// storm, lost responses, stale patches, pods deleted under queued calls,
// server throttling — asserting on what reached the server.
//
// They run etcd from $ETCD_BIN, else etcd in $PATH, else one the apiserver
// package builds with the go command from its test data (the module
// apiserver/testdata/etcd), once per machine into the user's cache
// directory (about a minute on a cold Go build cache): with only Go
// installed they still run.
// They fail, with an explanation, if none of the three gives an etcd.
package integration

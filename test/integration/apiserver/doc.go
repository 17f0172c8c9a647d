// Package apiserver runs a real kube-apiserver inside a test binary, for
// integration tests of github.com/coalescer/dispatch against the behaviour a
// production cluster has: optimistic concurrency, pods/binding semantics,
// server-side throttling and connections that die mid-request.
//
// [Start] launches etcd as a child process (see [StartEtcd]), then
// kube-apiserver in-process through
// k8s.io/kubernetes/cmd/kube-apiserver/app/testing, and puts a [Proxy] in
// front of it. Tests drive the code under test with [Server.Config] (through
// the proxy, as an unprivileged user the inflight limits apply to) and make
// setup calls and assertions with [Server.AdminConfig] (direct, as the
// loopback superuser, never throttled nor recorded). Everything stops when the
// test ends, through t.Cleanup.
//
// etcd is the binary named by $ETCD_BIN, else etcd in $PATH (Debian's
// etcd-server package installs /usr/bin/etcd), else one built with the go
// command from this package's test data, the module testdata/etcd, whose
// go.mod pins an etcd server release of the 3.7 line, the one Kubernetes 1.37 is tested
// with: so the tests need nothing but Go. That build runs once per machine,
// into dispatch-etcd/ under [os.UserCacheDir] (~/.cache on Linux), outside the
// workspace (GOWORK=off), and takes about a minute on two cores with a cold
// Go build cache; later test runs reuse the binary, and test binaries
// started at once share one build through a file lock. If the build fails
// too, the test fails with an explanation: these tests are meant to run in
// CI, not to be skipped.
//
// Linking kube-apiserver makes a test binary large and slow to build, above
// all with -race: keep every test that starts a server in as few packages as
// possible, so that CI links it once.
package apiserver

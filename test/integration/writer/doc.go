// Package writer holds the tests of
// github.com/coalescer/dispatch/kube/writer against a real kube-apiserver and
// etcd, started by package
// [github.com/coalescer/dispatch/test/integration/apiserver], and the
// benchmark that sets the writer beside the status updaters controllers write
// by hand.
//
// Every test installs a custom resource with a status subresource and runs
// the writer as a service account holding only what a controller of that
// resource holds under RBAC: get, list and watch on the resource, update and
// patch on its status. TestWriterScenarios runs the five scenarios — churn,
// a second writer, recreated objects, a server that pushes back, priority
// during a storm — asserting on what reached the server, counted at the
// proxy in front of it and watched from it.
package writer

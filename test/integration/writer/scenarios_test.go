package writer_test

import (
	"testing"
)

// TestWriterScenarios runs the writer against a real kube-apiserver and
// etcd, as a service account with a controller's RBAC, on a custom
// resource with a status subresource: the scenarios no fake settles,
// because they depend on what the server does — resourceVersions and
// watch events, 409s from a second writer, the UID fence on a recreated
// object, throttling, and the order writes reach it in.
//
// The subtests share one apiserver, each in a namespace of its own with a
// writer of its own. Every assertion is about what reached the server —
// counted at the proxy in front of it, watched, and read back as the admin —
// and about order, never about wall time.
func TestWriterScenarios(t *testing.T) {
	st := startStack(t)
	t.Run("1 churn", func(t *testing.T) { testChurn(t, st) })
	t.Run("2 a second writer", func(t *testing.T) { testSecondWriter(t, st) })
	t.Run("3 recreated objects", func(t *testing.T) { testRecreated(t, st) })
	t.Run("4 the server pushes back", func(t *testing.T) { testPushback(t, st) })
	t.Run("5 priority during a storm", func(t *testing.T) { testPriority(t, st) })
}

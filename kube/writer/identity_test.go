package writer_test

import (
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A change that renames or moves the object it was given writes the
// object its desire was for, in every mode: the identity is the writer's
// (Set takes the object's namespace, name and UID), never the change's.
func TestChangeCannotRedirectItsWrite(t *testing.T) {
	edits := map[string]func(deploy){
		"name":      func(d deploy) { d.Name = "b" },
		"namespace": func(d deploy) { d.Namespace = "other" },
		"uid":       func(d deploy) { d.UID = "not-a" },
	}
	for _, mode := range []writer.Mode{writer.ModeUpdate, writer.ModePatch, writer.ModeApply} {
		for what, edit := range edits {
			t.Run(mode.String()+"/"+what, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					e := newEnv(t, deployment("a"), deployment("b"), deploymentIn("other", "a"))
					w := newWriter(t, e, writer.Options[deploy]{Mode: mode})
					b, otherA := e.get(t, "b"), e.getIn(t, "other", "a")
					tk, err := w.Submit(t.Context(), e.get(t, "a"), status(func(d deploy) error {
						d.Status.Replicas = 4
						edit(d)
						return nil
					}), writer.SetOptions{})
					require.NoError(t, err)
					res, err := tk.Wait(t.Context())
					require.NoError(t, err)
					assert.Equal(t, int32(4), e.get(t, "a").Status.Replicas, "the object the desire was for")
					assert.Equal(t, 1, res.Writes)
					assert.Equal(t, b, e.get(t, "b"), "another object of the namespace")
					assert.Equal(t, otherA, e.getIn(t, "other", "a"), "the object of that name in another namespace")
					assert.Zero(t, w.Stats().Conflicts)
				})
			})
		}
	}
}

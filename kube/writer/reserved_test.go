package writer_test

import (
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ReservedWorkers are kept for the highest priority in Classes, whatever
// its sign: with every class below zero ("" named too), a Ready flip still
// takes the reserved worker while routine writes hold up the rest.
func TestReservedWorkersForTheMostUrgentClass(t *testing.T) {
	for _, classes := range []map[string]int{
		{"ready": 10, "routine": 0},
		{"ready": -10, "": -20},
		{"ready": -10, "routine": -20, "": -20},
	} {
		t.Run(fmt.Sprint(classes), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, deployment("slow-1"), deployment("slow-2"), deployment("flip"))
				held := make(chan struct{})
				hold := func(d deploy) error { <-held; d.Status.Replicas = 1; return nil }
				w := newWriter(t, e, writer.Options[deploy]{Workers: 2, ReservedWorkers: 1, Classes: classes})
				routine := ""
				if _, ok := classes["routine"]; ok {
					routine = "routine"
				}
				for _, name := range []string{"slow-1", "slow-2"} {
					require.NoError(t, w.Set(e.identity(t, name), status(hold), writer.SetOptions{Class: routine}))
				}
				synctest.Wait() // one routine write holds a worker, the other is queued
				tk, err := w.Submit(t.Context(), e.get(t, "flip"), status(replicas(1)), writer.SetOptions{Class: "ready"})
				require.NoError(t, err)
				synctest.Wait()
				_, done := tk.Result()
				assert.True(t, done, "the Ready flip waits for a routine write though a worker is kept for it")
				close(held)
				settle(t, w)
			})
		})
	}
}

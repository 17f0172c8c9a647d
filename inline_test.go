package dispatch

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSyncRunsInCaller: in Sync mode each call runs inline, on the
// goroutine that submits it, so Post returns only after the call ran; a
// refusal is still returned at once.
func TestSyncRunsInCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ranOn []uint64 // the goroutine of each execution
		d := newD(t, func(context.Context, string, int) error {
			ranOn = append(ranOn, goroutineID())
			return nil
		}, Config[string, int]{Rollout: RolloutPolicy{Mode: ModeSync}})
		for i := range 5 {
			require.NoError(t, d.Post(fmt.Sprint(i), i, SubmitOptions{}))
			require.Len(t, ranOn, i+1, "Post in Sync returns after the call ran")
			assert.Equal(t, goroutineID(), ranOn[i], "the call ran on another goroutine than its caller's")
		}
		assert.ErrorIs(t, d.Post("x", 0, SubmitOptions{Deadline: time.Now().Add(-1)}), ErrExpired)
		closeD(t, d)
	})
}

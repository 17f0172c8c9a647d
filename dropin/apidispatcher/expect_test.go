package apidispatcher

import (
	"errors"
	"testing"
	"time"
)

// expectOnFinish waits up to 100ms for the one result on onFinish and
// checks that it matches want (errors.Is; nil for success).
//
// Upstream's api_dispatcher_test.go, which tests the exported API, uses a
// helper of this name that upstream defines in call_queue_test.go, with
// the tests of its private queue. The materialise tool leaves that file
// out of the drop-in's build, and puts this file in its place, so that the
// exported-API test compiles and runs against the drop-in unchanged.
func expectOnFinish(t *testing.T, onFinish <-chan error, want error) {
	t.Helper()
	select {
	case err := <-onFinish:
		if !errors.Is(err, want) {
			t.Errorf("OnFinish got %v, want %v", err, want)
		}
	case <-time.After(100 * time.Millisecond):
		t.Fatal("nothing on OnFinish within 100ms")
	}
}

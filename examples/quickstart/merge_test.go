package main

import (
	"errors"
	"testing"

	"github.com/coalescer/dispatch"
)

// TestMergeStatus pins the merge the example teaches for calls that share
// a pod's key: a bind replaces a pending status patch, a patch behind a
// pending bind is moot, and two patches fold into the newer one.
func TestMergeStatus(t *testing.T) {
	patch := func(attempt, updates int) call { return call{kind: statusPatch, attempt: attempt, updates: updates} }
	b := call{kind: bind, node: "node-1"}
	for _, tc := range []struct {
		name              string
		pending, incoming call
		want              call
		wantErr           error
	}{
		{"bind replaces a pending patch", patch(1, 3), b, b, dispatch.ReplacePending},
		{"a patch behind a pending bind is moot", b, patch(2, 1), b, dispatch.SkipIncoming},
		{"two patches fold into the newer", patch(1, 3), patch(2, 1), patch(2, 4), nil},
	} {
		got, err := mergeStatus(tc.pending, tc.incoming)
		if got != tc.want || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
			t.Errorf("%s: mergeStatus = %+v, %v; want %+v, %v", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

package writer

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func obj(m map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: m}
	u.SetUID("u1")
	u.SetResourceVersion("7")
	return u
}

// patchBody's patch, applied by the library the apiserver uses, takes
// base to desired; against an object changed in a field it sets, or of
// another UID, it fails.
func TestPatchBody(t *testing.T) {
	base := obj(map[string]any{
		"metadata": map[string]any{"labels": map[string]any{"keep": "1", "drop": "2", "a/b~c": "3"}},
		"spec":     map[string]any{"x": int64(1)},
		"status":   map[string]any{"phase": "Pending", "conditions": []any{map[string]any{"type": "A"}}},
	})
	desired := base.DeepCopy()
	desired.Object["status"] = map[string]any{"phase": "Ready", "conditions": []any{map[string]any{"type": "A"}, map[string]any{"type": "B"}}, "new": true}
	desired.SetLabels(map[string]string{"keep": "1", "a/b~c": "4", "added": "5"})

	for _, tc := range []struct {
		t      target
		strict bool
	}{{targetStatus, false}, {targetStatus, true}, {targetObject, false}, {targetObject, true}} {
		body, err := patchBody(tc.t, base, desired, "u1", tc.strict)
		require.NoError(t, err)
		p, err := jsonpatch.DecodePatch(body)
		require.NoError(t, err)
		doc, _ := json.Marshal(base.Object)
		out, err := p.Apply(doc)
		require.NoError(t, err, "%s", body)
		var got map[string]any
		require.NoError(t, json.Unmarshal(out, &got))
		want := base.DeepCopy().Object
		if tc.t == targetStatus {
			want["status"] = desired.Object["status"]
		} else {
			want["metadata"] = desired.Object["metadata"]
		}
		wantJSON, _ := json.Marshal(want)
		gotJSON, _ := json.Marshal(got)
		assert.JSONEq(t, string(wantJSON), string(gotJSON), "%s", body)

		// Another writer changed a field this patch sets, or the object
		// was replaced: the patch fails.
		other := base.DeepCopy()
		if tc.t == targetStatus {
			other.Object["status"].(map[string]any)["phase"] = "Failed"
		} else {
			other.SetLabels(map[string]string{"keep": "1", "drop": "x", "a/b~c": "3"})
		}
		other.SetResourceVersion("8")
		doc, _ = json.Marshal(other.Object)
		_, err = p.Apply(doc)
		assert.Error(t, err, "%s", body)
		replaced := base.DeepCopy()
		replaced.SetUID("u2")
		doc, _ = json.Marshal(replaced.Object)
		_, err = p.Apply(doc)
		assert.Error(t, err)
	}
}

// Without strict, a change to a field the patch does not set does not fail
// it: field-level concurrency.
func TestPatchBodyIgnoresOtherFields(t *testing.T) {
	base := obj(map[string]any{"status": map[string]any{"phase": "Pending", "other": "a"}})
	desired := base.DeepCopy()
	desired.Object["status"].(map[string]any)["phase"] = "Ready"
	body, err := patchBody(targetStatus, base, desired, "u1", false)
	require.NoError(t, err)
	p, _ := jsonpatch.DecodePatch(body)
	changed := base.DeepCopy()
	changed.Object["status"].(map[string]any)["other"] = "b"
	changed.SetResourceVersion("9")
	doc, _ := json.Marshal(changed.Object)
	out, err := p.Apply(doc)
	require.NoError(t, err)
	assert.JSONEq(t, `{"metadata":{"uid":"u1","resourceVersion":"9"},"status":{"phase":"Ready","other":"b"}}`, string(out))
}

func TestPatchBodyNothingToSet(t *testing.T) {
	base := obj(map[string]any{"status": map[string]any{"n": int64(1)}})
	desired := base.DeepCopy()
	desired.Object["status"].(map[string]any)["n"] = 1 // an int: the same JSON
	body, err := patchBody(targetStatus, base, desired, "u1", false)
	require.NoError(t, err)
	assert.Nil(t, body)
}

func TestPruneAndSubset(t *testing.T) {
	cfg := prune(map[string]any{
		"metadata": map[string]any{"creationTimestamp": nil, "labels": map[string]any{}},
		"status": map[string]any{
			"conditions": []any{map[string]any{"type": "Ready", "status": "True"}},
			"n":          int64(2),
		},
	}, nil, true)
	assert.Equal(t, map[string]any{"status": map[string]any{
		"conditions": []any{map[string]any{"type": "Ready", "status": "True"}},
		"n":          int64(2),
	}}, cfg)
	live := map[string]any{"status": map[string]any{
		"conditions": []any{
			map[string]any{"type": "Other", "status": "False"},
			map[string]any{"type": "Ready", "status": "True", "lastTransitionTime": "t"},
		},
		"n":     float64(2),
		"other": "x",
	}}
	assert.True(t, subset(cfg, live), "another manager's condition and field are not this one's")
	live["status"].(map[string]any)["n"] = int64(3)
	assert.False(t, subset(cfg, live))
	assert.False(t, subset(map[string]any{"a": []any{"x"}}, map[string]any{"a": "x"}))
	assert.True(t, sameJSON([]any{int64(1), map[string]any{"a": 1}}, []any{1, map[string]any{"a": float64(1)}}))
	assert.False(t, sameJSON([]any{1}, []any{1, 2}))
}

package writer

import "testing"

func TestSameContentCases(t *testing.T) {
	cases := []struct {
		a, b any
		want bool
	}{
		{nil, nil, true}, {nil, []any{}, true}, {map[string]any{"a": nil}, map[string]any{}, true},
		{map[string]any{"a": map[string]any{"b": nil}}, map[string]any{"a": map[string]any{}}, true},
		// An empty map is a value, not null: a volume's emptyDir: {} chooses its type.
		{nil, map[string]any{}, false}, {map[string]any{"a": nil}, nil, false},
		{map[string]any{"a": map[string]any{"b": nil}}, map[string]any{}, false},
		{map[string]any{"name": "v", "emptyDir": map[string]any{}}, map[string]any{"name": "v"}, false},
		{map[string]any{"a": "x"}, map[string]any{}, false}, {map[string]any{}, map[string]any{"a": "x"}, false},
		{map[string]any{"a": false}, map[string]any{}, false}, {map[string]any{"a": int64(0)}, map[string]any{}, false},
		{int64(3), float64(3), true}, {"a", "b", false}, {[]any{nil}, []any{}, false}, {[]any{"a"}, []any{"a"}, true},
		{[]any{map[string]any{"x": nil}}, []any{map[string]any{}}, true}, {"x", map[string]any{}, false}, {map[string]any{"a": "x"}, []any{"x"}, false},
	}
	for i, c := range cases {
		if got := sameContent(c.a, c.b); got != c.want {
			t.Errorf("%d: sameContent(%v, %v) = %v", i, c.a, c.b, got)
		}
		if got := sameContent(c.b, c.a); got != c.want {
			t.Errorf("%d: sameContent(%v, %v) = %v (swapped)", i, c.b, c.a, got)
		}
	}
}

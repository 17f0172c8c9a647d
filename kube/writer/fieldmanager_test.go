package writer_test

import (
	"strings"
	"testing"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A field manager the API server refuses on every write (longer than 128
// bytes, or not printable) is refused by New, naming the field; one at
// the limit is taken.
func TestFieldManagerTheServerWouldRefuse(t *testing.T) {
	e := newEnv(t)
	for name, fm := range map[string]string{
		"too long":      strings.Repeat("m", 129),
		"not printable": "ctl\x00",
		"newline":       "ctl\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := writer.New(e.c, writer.Options[deploy]{FieldManager: fm})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "Options.FieldManager")
		})
	}
	w, err := writer.New(e.c, writer.Options[deploy]{FieldManager: strings.Repeat("m", 128)})
	require.NoError(t, err)
	require.NoError(t, w.Close(t.Context()))
}

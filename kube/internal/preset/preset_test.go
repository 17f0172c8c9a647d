package preset

import (
	"testing"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
)

func TestStart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      dispatch.StartPolicy
		workers int
		want    dispatch.StartPolicy
	}{
		{"a quarter", dispatch.StartPolicy{}, 16, dispatch.StartPolicy{ReservedWorkers: 4, UrgentPriority: 20}},
		{"at least one", dispatch.StartPolicy{}, 3, dispatch.StartPolicy{ReservedWorkers: 1, UrgentPriority: 20}},
		{"none of one worker", dispatch.StartPolicy{}, 1, dispatch.StartPolicy{}},
		{"none asked for", dispatch.StartPolicy{ReservedWorkers: -1, UrgentPriority: 5}, 16, dispatch.StartPolicy{UrgentPriority: 5}},
		{"the user's own", dispatch.StartPolicy{ReservedWorkers: 2, UrgentPriority: 7}, 16, dispatch.StartPolicy{ReservedWorkers: 2, UrgentPriority: 7}},
		{"the rest kept", dispatch.StartPolicy{NoDeadlineCheck: true, DeadlineSamples: 3}, 8,
			dispatch.StartPolicy{ReservedWorkers: 2, UrgentPriority: 20, NoDeadlineCheck: true, DeadlineSamples: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Start(tc.in, tc.workers, 20))
		})
	}
}

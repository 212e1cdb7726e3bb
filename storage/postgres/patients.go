package postgres

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SyntheticPatients is phi.PatientKinds on the patients table.
type SyntheticPatients struct{ Pool *pgxpool.Pool }

// Synthetic returns the organization of each synthetic patient among ids.
func (s SyntheticPatients) Synthetic(ctx context.Context, ids []string) (map[string]string, error) {
	slices.Sort(ids)
	ids = slices.Compact(ids)
	rows, err := s.Pool.Query(ctx, `select id, org_id from patients where id = any($1) and synthetic`, ids)
	if err != nil {
		return nil, fmt.Errorf("synthetic patients: %w", err)
	}
	defer rows.Close()
	out := make(map[string]string, len(ids))
	for rows.Next() {
		var id, org string
		if err := rows.Scan(&id, &org); err != nil {
			return nil, fmt.Errorf("synthetic patients: %w", err)
		}
		out[id] = org
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("synthetic patients: %w", err)
	}
	return out, nil
}

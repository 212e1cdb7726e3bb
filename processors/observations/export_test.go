package observations

import (
	"carehub/schemas/kafka/observation"
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// StoreFunc returns the writer's batch store on pool, for benchmarks of the Postgres side alone.
func StoreFunc(pool *pgxpool.Pool) func(context.Context, []observation.Message) error {
	s := newStore(pool)
	return func(ctx context.Context, msgs []observation.Message) error {
		_, err := s.write(ctx, msgs)
		return err
	}
}

package observations

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"carehub/schemas/kafka/observation"
)

// StoreFunc returns the writer's batch store on pool, for benchmarks of the Postgres side alone.
func StoreFunc(pool *pgxpool.Pool) func(context.Context, []observation.Message) error {
	s := newStore(pool)
	return func(ctx context.Context, msgs []observation.Message) error {
		_, err := s.write(ctx, msgs)
		return err
	}
}

// StorePaths returns the store's two ways of storing new observations on pool: the direct COPY
// and the staged insert. Each returns how many of msgs it stored.
func StorePaths(pool *pgxpool.Pool) (direct, staged func(context.Context, []observation.Message) (int, error)) {
	s := newStore(pool)
	direct = func(ctx context.Context, msgs []observation.Message) (int, error) {
		res, err := s.copyNew(ctx, msgs)
		return len(res.stored), err
	}
	staged = func(ctx context.Context, msgs []observation.Message) (int, error) {
		res, err := s.writeTx(ctx, msgs, false)
		return len(res.stored), err
	}
	return direct, staged
}

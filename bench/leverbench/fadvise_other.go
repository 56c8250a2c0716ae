//go:build !linux

package leverbench

import (
	"errors"
	"os"
)

func fadviseDontNeed(*os.File) error {
	return errors.New("lever: dropping a file from the page cache needs Linux")
}

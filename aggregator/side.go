package aggregator

import "fmt"

// Side is one of the two daemons. The zero value is invalid.
type Side uint8

// The two sides. The paper's l and r are relative to the aggregator; these
// are absolute.
const (
	Device Side = 1 + iota
	Cloud
)

// Sides lists both sides in index order.
var Sides = [2]Side{Device, Cloud}

// Valid reports whether s names a side.
func (s Side) Valid() bool { return s == Device || s == Cloud }

// Other is the opposite side.
func (s Side) Other() Side {
	if s == Device {
		return Cloud
	}
	return Device
}

// Index is s's slot in per-side arrays (device 0, cloud 1).
func (s Side) Index() int { return int(s) - 1 }

func (s Side) String() string {
	switch s {
	case Device:
		return "device"
	case Cloud:
		return "cloud"
	}
	return fmt.Sprintf("Side(%d)", uint8(s))
}

// ParseSide reads "device" or "cloud".
func ParseSide(s string) (Side, error) {
	switch s {
	case "device":
		return Device, nil
	case "cloud":
		return Cloud, nil
	}
	return 0, fmt.Errorf("aggregator: unknown side %q (want device or cloud)", s)
}

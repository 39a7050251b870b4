from appliance.face.cli import main

raise SystemExit(main())

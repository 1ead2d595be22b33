from hvdtrain.cli import main

raise SystemExit(main())
